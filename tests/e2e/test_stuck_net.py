"""Who is stuck when a host's network is cut: 2 real SSH hosts (sshhosts.py), real torchrun and
gloo; node1's veth goes down inside its namespace. node0 (the rendezvous host, where the judge
runs) waits in its all-reduce (gloo's timeout is 600 s here); the verdict names node1's ranks
`unreachable`, and no healthy rank. A cut node and one healthy peer show it: each node more
is two torch imports more."""

from __future__ import annotations

import pytest

from console.run.run import LaunchSpec

# test_ssh_run puts tests/ on the path (spine.helpers); user_ssh and secret are its fixtures
from test_ssh_run import SCRIPT, TIMEOUT, secret, ssh_controller, user_ssh  # noqa: F401
from spine.helpers import TINY, wind_down  # noqa: E402
from tests.waits import wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
CUT = "node1"  # not node0: the judge runs on the rendezvous host


async def test_a_cut_host_is_named_unreachable_and_no_healthy_rank(user_ssh, secret, tmp_path,
                                                                   host_workdir, project):
    ctl, _got = ssh_controller(user_ssh, tmp_path, host_workdir, n=2)  # node1 and node0
    st = ctl.state
    try:
        await ctl.launch(LaunchSpec(script=SCRIPT, sync=str(project), max_restarts=0, grace=3,
                                    stall_after=6.0,
                                    args=TINY + ["--steps", "100000", "--ckpt-every", "0",
                                                 "--pg-timeout", "600"]), preflight=False)
        await wait_for(lambda: len(st.ranks) == 2 and all((r.step or 0) >= 3
                                                          for r in st.ranks.values()),
                       TIMEOUT, "first steps")
        cut_ranks = sorted(r.rank for r in st.ranks.values() if r.node == CUT)
        user_ssh.link_down(CUT)
        try:
            await wait_for(lambda: (st.verdict or {}).get("kind") == "unreachable", 120,
                           "a verdict naming the cut host")
            verdict = st.verdict
        finally:
            user_ssh.link_up(CUT)
            # back before the run is stopped: a stop must reach node1's processes too
            await wait_for(lambda: ctl.links[CUT].connected.is_set() and
                           st.nodes[CUT].state != "unreachable", 120, "node1 reconnected")
        assert [(s["rank"], s["node"]) for s in verdict["suspects"]] == \
            [(r, CUT) for r in cut_ranks], verdict
        assert list(verdict["evidence"]["unreachable"]) == [CUT], verdict
        healthy = sorted(set(st.ranks) - set(cut_ranks))
        assert verdict["evidence"]["waiting_ranks"] == healthy, verdict
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
