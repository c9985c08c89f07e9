"""Hang triage with real parts: a rank hangs, rankdeck says which, and a restart recovers."""

from __future__ import annotations

import re

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.judgement.stacks import group
from console.transport.local import LocalTransport

from tests.waits import wait_for

from .helpers import TINY, TRAINER, local_inventory, wind_down

pytestmark = pytest.mark.e2e
TIMEOUT = 300


async def test_hung_rank_is_found_by_stacks_and_a_node_restart_recovers(tmp_path):
    # 3 nodes: the fewest where rank 1's stack is the odd one out (each node more is its
    # torchrun's and worker's start-up, the test's time)
    ctl = RunController(local_inventory(tmp_path / "work", n=3), LocalTransport(), History())
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=1, grace=3, stall_after=6.0,
                                    args=TINY + ["--steps", "100000", "--ckpt-every", "4",
                                                 "--hang-at-step", "6", "--hang-rank", "1",
                                                 "--pg-timeout", "600"]), preflight=False)
        ranks = ctl.state.ranks
        await wait_for(lambda: len(ranks) == 3 and all(r.state == "stalled"
                                                       for r in ranks.values()),
                       TIMEOUT, "every rank stalled behind the hung one")
        assert max(r.step for r in ranks.values()) <= 6
        stalled = [e for e in ctl.state.events if e.kind == "stalled"]
        assert {e.rank for e in stalled} == {0, 1, 2}
        assert ctl.state.status()["nodes"][0]["ranks"][0]["state"] == "stalled"

        # the stacks single out rank 1, sleeping in the injected hang
        results = await ctl.stacks()
        all_ranks = [dict(r, node=n) for n, res in results.items() for r in res["ranks"]]
        assert sorted(r["rank"] for r in all_ranks) == [0, 1, 2]
        assert all(r["method"] in ("py-spy", "faulthandler") for r in all_ranks), all_ranks
        annotated, odd = group(all_ranks)
        assert odd == [1], [(r["rank"], r["frames"][:3]) for r in annotated]
        hung = [r for r in annotated if r["rank"] == 1][0]
        assert any("injected_hang" in f for f in hung["frames"]), hung["frames"]
        hung_node = hung["node"]
        assert ranks[1].node == hung_node

        # restart the hung rank's node: everybody steps again from the checkpoint
        res = await ctl.restart(hung_node)
        assert res[hung_node]["launches"] == 2
        await wait_for(lambda: all(r.state == "running" and (r.step or 0) > 8
                                   for r in ranks.values()), TIMEOUT,
                       "all ranks stepping past the hang")
        assert ctl.state.nodes[hung_node].restarts == 1
        assert sum(n.restarts for n in ctl.state.nodes.values()) == 1
        kinds = [e.kind for e in ctl.state.events if e.node == hung_node]
        assert "restarting" in kinds and "killed" in kinds
        killed = [e for e in ctl.state.events if e.kind == "killed" and e.node == hung_node]
        assert re.search(r"none left", killed[-1].text), killed[-1].text
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
