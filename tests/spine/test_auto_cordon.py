"""`launch --auto-cordon` with real torchrun and the reference trainer on 3 local nodes (2 in
the run, node2 a spare that hosts the store and the judge), launched with `--detach` and left
with no console: node1 is restarted (`rankdeck restart`), then its torchrun dies (SIGKILL: a
crash again, soon after the restart). The judge cordons node1 itself, starts the spare from
the spec kept on its host, and every rank steps again from the checkpoint
(docs/SURGERY.md)."""

from __future__ import annotations

import os
import signal

import pytest

from agent.host.journal import JournalReader
from agent.host.runfiles import read_json

from tests.cli import UNBUFFERED, rankdeck
from tests.waits import wait_for_sync

from .helpers import node_dir
from .test_cordon import of_node
from .test_judge import TIMEOUT, judge_events, launch_detached, stop, wait_for_event

pytestmark = pytest.mark.e2e


def steps(workdir: str, run_id: str, node: str, since: int = 0) -> list[int]:
    """The steps ``node``'s ranks printed, from byte ``since`` of its journal on."""
    reader = JournalReader(os.path.join(node_dir(workdir, run_id, node), "journal"), since)
    return [m["step"] for m, _d, _e in reader.read(limit=64 << 20)
            if m.get("k") == "metric" and isinstance(m.get("step"), int)]


def test_auto_cordon_puts_the_spare_in_for_a_node_that_crashes_again_after_its_restart(
        tmp_path):
    run_id, workdir = launch_detached(
        tmp_path, ["--steps", "100000", "--ckpt-every", "2",
                   "--ckpt-dir", str(tmp_path / "ckpt")],  # shared, as a spare needs
        "--max-restarts", "5", "--auto-cordon", "--spares", "node2", nodes=3)
    try:
        kept = os.path.join(node_dir(workdir, run_id, "node2"), "standby.json")
        assert oct(os.stat(kept).st_mode & 0o777) == "0o600"  # the run's env is in it
        wait_for_sync(lambda: max(steps(workdir, run_id, "node1") or [0]) >= 3, TIMEOUT,
                      "node1 past its first checkpoint", every=0.5)
        out = rankdeck("restart", run_id, "--node", "node1", env=UNBUFFERED)
        assert out.returncode == 0, out.stdout + out.stderr
        state = os.path.join(node_dir(workdir, run_id, "node1"), "state.json")
        wait_for_sync(lambda: (read_json(state) or {}).get("launches") == 2 and
                      (read_json(state) or {}).get("torchrun_pid"), TIMEOUT,
                      "node1's torchrun started again")
        os.kill(read_json(state)["torchrun_pid"], signal.SIGKILL)  # in trouble again

        outcome = wait_for_event(workdir, run_id, lambda e: e["what"] == "surgery" and
                                 e.get("action") == "outcome", "the judge's cordon")[0]
        assert (outcome["who"], outcome["out"], outcome["in"]) == ("judge", "node1", "node2")
        # its supervisor had ended: nothing of it left, nothing to fence from the judge's host
        assert outcome["outcome"] == "done, not fenced" and outcome["left"] == [], outcome
        assert outcome["gpu"] == "no GPU"
        proposed = [e for e in judge_events(workdir, run_id) if e["what"] == "cordon proposed"]
        assert [e["node"] for e in proposed] == ["node1"], proposed
        assert "ended failed" in proposed[0]["reason"]
        assert not os.path.exists(kept)  # the spare started: the spec is in memory only
        # the spare's torchrun held since launch went in (agent/surgery/spare_hold.py), not a new one
        spare = read_json(os.path.join(node_dir(workdir, run_id, "node2"), "state.json"))
        assert (spare["state"], spare["launches"], spare.get("warm")) == ("running", 1, True)

        node0_from = os.path.getsize(os.path.join(node_dir(workdir, run_id, "node0"),
                                                  "journal"))
        wait_for_sync(lambda: len(steps(workdir, run_id, "node2")) >= 3 and
                      len(steps(workdir, run_id, "node0", node0_from)) >= 3, TIMEOUT,
                      lambda: "both ranks stepping: node0 %s, node2 %s" % (
                          steps(workdir, run_id, "node0", node0_from)[-3:],
                          steps(workdir, run_id, "node2")[-3:]), every=0.5)
        assert not of_node(run_id, "node1"), of_node(run_id, "node1")
    finally:
        stop(run_id)
