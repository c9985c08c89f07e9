"""A run where every rank prints nothing (issue 15): its ranks are `running` while their CPU
advances, and `stalled` once no rank's CPU does (console/rankcpu.py). Real torchrun, gloo,
2 local nodes; the supervisors sample the workers' CPU every second (agent/ranksample.py)."""

from __future__ import annotations

import os

import pytest

from console.history import History
from console.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

from tests.waits import wait_for

from .helpers import local_inventory, wind_down

pytestmark = pytest.mark.e2e
TIMEOUT = 300
SILENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "silent_worker.py")


async def test_a_run_that_prints_nothing_runs_then_stalls_when_its_cpu_stops(tmp_path):
    ctl = RunController(local_inventory(tmp_path / "work", n=2), LocalTransport(), History())
    ctl.state.stall_min_s = 8.0
    await ctl.launch(LaunchSpec(script=SILENT, max_restarts=0, grace=3,
                                env={"RANKDECK_SAMPLE_S": "1", "BUSY_S": "25"}), preflight=False)
    ranks = ctl.state.ranks
    try:
        await wait_for(lambda: len(ranks) == 2 and all(r.state == "running" for r in ranks.values()),
                       TIMEOUT, "both silent ranks running")
        assert ctl.state.run_state() == "running"
        assert all(r["silent"] and r["cpu_s"] > 0
                   for n in ctl.status()["nodes"] for r in n["ranks"])
        await wait_for(lambda: all(r.state == "stalled" for r in ranks.values()),
                       TIMEOUT, "both ranks stalled once their CPU stopped")
        stalls = [e for e in ctl.state.events if e.kind == "stalled"]
        assert sorted(e.rank for e in stalls) == [0, 1], stalls
        assert all("no rank's CPU" in e.text for e in stalls), stalls
        assert ctl.state.run_state() == "running"  # stalled, never back to `starting`
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
