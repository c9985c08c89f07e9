"""A launch on a flagged host (agent/rules/fleet.py: incidents in 2 of its last 5 runs):
warned with its incidents, and with ``--avoid-flagged`` a spare of the inventory takes its
place (said in the output). Real torchrun and the reference trainer on 3 local nodes, each with
a workdir of its own; node1's record is written by the agent's own writer
(agent/host/fleet.py), and once the run ends each node's supervisor adds it to its host's
record."""

from __future__ import annotations

import json
import os

import pytest

from agent.host import fleet
from agent.rules import fleet as rules

from tests.cli import UNBUFFERED, rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import TINY, TRAINER, all_ended

pytestmark = pytest.mark.e2e


def test_avoid_flagged_puts_the_spare_in_the_flagged_hosts_place(tmp_path):
    work = [str(tmp_path / ("work%d" % i)) for i in range(3)]
    inv = write_inventory(tmp_path, work, 3)
    runs1 = os.path.join(work[1], ".rankdeck", "runs")
    for i, kind in ((1, "verdict"), (2, "crashed")):
        ndir = os.path.join(runs1, "old%d" % i, "node1")
        os.makedirs(ndir)
        fleet.note_end(ndir, "old%d" % i, "node1", "failed",
                       [rules.incident(kind, "old trouble %d" % i)], ended=1000.0 + i)
    out = rankdeck("launch", "--detach", "--skip-preflight", "--spares", "node2",
                   "--avoid-flagged", "-i", inv, TRAINER, "--", *TINY, "--steps", "3",
                   env=UNBUFFERED)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = out.stdout.strip().splitlines()[-1]
    try:
        assert "node1 is flagged" in out.stderr and "old trouble 2" in out.stderr, out.stderr
        assert "spare node2 takes flagged node1's place" in out.stderr, out.stderr

        def ended():
            doc = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
            return doc if doc.get("state") in ("succeeded", "failed", "stopped") else None
        doc = wait_for_sync(ended, 300, "the run to end", every=1.0)
        assert doc["state"] == "succeeded", doc
        assert sorted(n["name"] for n in doc["nodes"]) == ["node0", "node2"], doc["nodes"]
        # each node's supervisor put the run into its host's record as it ended
        assert [r["run_id"] for r in fleet.read(os.path.join(work[2], ".rankdeck", "runs"))
                ["runs"]] == [run_id]
        assert not os.path.exists(os.path.join(runs1, run_id))
    finally:
        rankdeck("stop", run_id, env=UNBUFFERED)
        all_ended(run_id)
