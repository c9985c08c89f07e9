"""An elastic run (--nnodes 2:3) carries on without a lost node and takes it back (3 local
nodes: each node more is its torchrun's and worker's start-up, at launch and on every
membership change)."""

from __future__ import annotations

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

from tests.waits import wait_for

from .helpers import TINY, TRAINER, local_inventory, wind_down

pytestmark = pytest.mark.e2e
TIMEOUT = 300


async def test_elastic_run_loses_and_regains_a_node(tmp_path):
    ctl = RunController(local_inventory(tmp_path / "work", n=3), LocalTransport(), History())
    st = ctl.state
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, nnodes="2:3", max_restarts=5, grace=3,
                                    args=TINY + ["--steps", "100000", "--ckpt-every", "5"]),
                         preflight=False)
        await wait_for(lambda: st.world_size == 3 and len(st.ranks) == 3 and all(
            (r.step or 0) >= 3 for r in st.ranks.values()), TIMEOUT, "3 ranks stepping")

        res = await ctl.stop("node2")
        assert res["node2"]["state"] == "stopped" and res["node2"]["left"] == []
        await wait_for(lambda: st.world_size == 2, TIMEOUT, "world size 2")
        survivors = {r.rank: r.step for r in st.ranks.values() if r.rank < 2}
        await wait_for(lambda: all(st.ranks[r].state == "running" and
                                   (st.ranks[r].step or 0) > survivors[r] + 2
                                   for r in range(2)), TIMEOUT, "2 ranks stepping without node2")
        assert st.status()["world_size"] == 2
        assert st.nodes["node2"].state == "stopped"

        res = await ctl.restart("node2")  # its supervisor is gone: started again from the spec
        assert res["node2"]["state"] == "running", res
        await wait_for(lambda: st.world_size == 3, TIMEOUT, "world size 3 again")
        await wait_for(lambda: len([r for r in st.ranks.values() if r.state == "running"]) == 3,
                       TIMEOUT, "3 ranks stepping again")
        sizes = [e.text for e in st.events if e.kind == "world"]
        assert sizes[:2] == ["world size 3 -> 2", "world size 2 -> 3"], sizes
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
