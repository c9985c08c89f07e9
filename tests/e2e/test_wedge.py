"""A rendezvous that never completes says what it waits for (issue 11, "a run that never
comes back"), with real torchrun on two local nodes.

One node's torchrun is stopped (SIGSTOP: it can neither leave the rendezvous nor join the
next round, as a torchrun hung in the store or on a host that froze), then the other node is
restarted: its new torchrun waits in the rendezvous for a peer that never comes, and nothing
steps. rankdeck must say so: ``status --json`` names the node that has not joined and each
torchrun's phase, and a restart requested while that rendezvous is young is refused (a kill
mid-rendezvous can end the whole run); once the wait is past the threshold, restarting the
missing node is allowed and brings the run back.

The wait is the judge's rule (agent/rules/judge.py, agent/rules/rendezvous.py): the console shows
the judge's ``waiting`` event, and a detached run with no console anywhere gets it in the
judge's journal too.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from agent.host.journal import JournalReader
from agent.host.runfiles import read_json
from console.errors import AgentError
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY, TRAINER, all_ended, local_inventory, node_dir, wind_down  # noqa
from tests.cli import rankdeck  # noqa: E402
from tests.local_nodes import write_inventory  # noqa: E402
from tests.waits import wait_for, wait_for_sync  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT = 240
WAIT_S = 5  # the run's stall threshold: a rendezvous older than this is "waiting"


def stepping_since(ctl: RunController, since: float) -> bool:
    ranks = ctl.state.ranks
    return len(ranks) == 2 and all((r.last_progress or 0) > since for r in ranks.values())


def status_json(run_id: str) -> dict:
    out = rankdeck("status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def judge_waits(workdir, run_id: str) -> list[dict]:
    """The ``waiting`` events in the run's judge's journal (on the rendezvous host: here)."""
    path = os.path.join(str(workdir), ".rankdeck", "runs", run_id, "judge", "journal")
    return [m for m, _d, _e in JournalReader(path).read(limit=64 << 20)
            if m.get("k") == "event" and m.get("what") == "waiting"]


def freeze_torchrun(workdir, run_id: str, node: str) -> int:
    pid = read_json(os.path.join(node_dir(workdir, run_id, node), "state.json"),
                    {})["torchrun_pid"]
    os.kill(pid, signal.SIGSTOP)
    return pid


def thaw(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


async def test_a_rendezvous_waiting_for_a_stopped_torchrun_names_it(tmp_path):
    work = tmp_path / "work"
    ctl = RunController(local_inventory(work, n=2), LocalTransport(), History())
    # first: every rendezvous is young to this console (its restart refusal below), as with
    # `--stall-after 600` given to it; the run's own threshold, the judge's, is WAIT_S
    ctl.state.stall_min_s, ctl.state.stall_min_given = 600.0, True
    frozen = None
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=3, grace=3, stall_after=WAIT_S,
                                    args=TINY + ["--steps", "100000"]), preflight=False)
        nodes = ctl.state.nodes
        await wait_for(lambda: stepping_since(ctl, 0) and all(
            (n.phase or {}).get("name") == "workers running" for n in nodes.values()),
            TIMEOUT, "both ranks stepping, both torchruns running workers")

        frozen = freeze_torchrun(work, ctl.run_id, "node1")
        res = await ctl.restart("node0")
        assert not isinstance(res["node0"], BaseException), res

        # node0's new torchrun is starting or in the rendezvous: a second restart is refused
        again = (await ctl.restart("node0"))["node0"]
        assert isinstance(again, AgentError) and again.kind == "refused", again
        assert "rendezvous" in str(again) and "node0" in str(again), str(again)
        assert ctl.state.nodes["node0"].restarts == 1  # nothing was touched
        assert any(e.kind == "refused" for e in ctl.state.events)

        # past the threshold the judge says what the run waits for: node1, its torchrun's
        # phase; node0's new torchrun may take longer than WAIT_S to reach the rendezvous on a
        # loaded machine (until then it too is "starting", not joined): wait for it to join
        await wait_for(lambda: ctl.state.waiting is not None and ctl.state.waiting["joined"] == 1,
                       TIMEOUT, "the run waiting, node0 joined")
        assert any([m["node"] for m in e["missing"]] == ["node1"]
                   for e in judge_waits(work, ctl.run_id))  # the judge's, not this console's
        ctl.state.stall_min_s = WAIT_S  # this console's restart refusal: past it now
        doc = status_json(ctl.run_id)
        wait = doc["waiting_for"]
        assert wait is not None, doc
        assert [m["node"] for m in wait["missing"]] == ["node1"], wait
        assert wait["missing"][0]["phase"].startswith("workers running"), wait
        assert wait["joined"] == 1 and wait["nodes"] == 2, wait
        assert "node1" in wait["text"], wait
        phases = {n["name"]: n["phase"] for n in doc["nodes"]}
        assert phases["node0"]["name"] == "rendezvous", phases
        assert phases["node0"]["text"].startswith("rendezvous (round"), phases
        assert phases["node1"]["name"] == "workers running", phases
        assert any(e.kind == "waiting" and "node1" in e.text for e in ctl.state.events)

        # restarting the node that never joined is the remedy: allowed now, and it works
        since = max(r.last_progress or 0 for r in ctl.state.ranks.values())
        res = await ctl.restart("node1")
        assert not isinstance(res["node1"], BaseException), res
        frozen = None
        await wait_for(lambda: stepping_since(ctl, since), TIMEOUT, "both ranks stepping again")
        await wait_for(lambda: ctl.state.waiting is None, TIMEOUT, "the judge's wait over")
    finally:
        thaw(frozen)
        left = await wind_down(ctl)
    assert left == [], left


def test_a_detached_run_gets_the_wait_from_its_judge_with_no_console(tmp_path):
    """No console anywhere: launched with --detach, node0 restarted from a shell (which
    exits), node1's torchrun frozen; the judge alone writes what the rendezvous waits for."""
    work = str(tmp_path / "work")
    inv = write_inventory(tmp_path, work, 2)
    out = rankdeck("launch", "--detach", "--skip-preflight", "-i", inv, "--max-restarts", "3",
                   "--stall-after", str(WAIT_S), TRAINER, "--", *TINY, "--steps", "100000")
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = out.stdout.strip().splitlines()[-1]
    frozen = None
    try:
        def both_running() -> bool:
            states = [read_json(os.path.join(node_dir(work, run_id, n), "state.json"), {})
                      for n in ("node0", "node1")]
            return all((s.get("phase") or {}).get("name") == "workers running" for s in states)
        wait_for_sync(both_running, TIMEOUT, "both torchruns running workers", every=0.5)
        frozen = freeze_torchrun(work, run_id, "node1")
        out = rankdeck("restart", run_id, "--node", "node0")
        assert out.returncode == 0, out.stdout + out.stderr
        waits = wait_for_sync(
            lambda: [e for e in judge_waits(work, run_id)
                     if [m["node"] for m in e["missing"]] == ["node1"] and e["joined"] == 1],
            TIMEOUT, lambda: "the judge's wait for node1: %s" % judge_waits(work, run_id),
            every=0.5)
        assert "not joined: node1" in waits[0]["text"], waits
        assert waits[0]["missing"][0]["phase"].startswith("workers running"), waits
        doc = status_json(run_id)  # a new shell shows the judge's wait
        assert [m["node"] for m in doc["waiting_for"]["missing"]] == ["node1"], doc
    finally:
        thaw(frozen)
        out = rankdeck("stop", run_id)
        assert out.returncode == 0, out.stdout + out.stderr
        all_ended(run_id)
