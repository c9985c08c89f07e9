"""Who is stuck, with real parts: 4 local nodes (2 for the rank hung in Python, 3 for the
healthy run), torchrun, gloo, the reference trainer's faults, the flight-recorder hook and
py-spy. The verdict names the right rank, node and line, and a healthy run gets no suspect.
The rank in a different collective keeps its 4 nodes (tried on 3 under heavy load: its ranks
had not all stalled after 300 s, as on 4 under the same load; left at 4 until that is known)."""

from __future__ import annotations

import os

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

from tests.waits import wait_for

from .helpers import TINY, TRAINER, local_inventory, wind_down

pytestmark = pytest.mark.e2e
TIMEOUT = 300
FAULTS = os.path.join(os.path.dirname(TRAINER), "faults.py")


def line_of(code: str) -> int:
    """The line number in trainer/faults.py of the one line holding ``code``."""
    with open(FAULTS) as f:
        found = [i for i, line in enumerate(f, 1) if code in line]
    assert len(found) == 1, found
    return found[0]


async def _launch(tmp_path, extra: list[str], n: int = 4) -> RunController:
    ctl = RunController(local_inventory(tmp_path / "work", n=n), LocalTransport(), History())
    await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0, grace=3, stall_after=6.0,
                                args=TINY + ["--steps", "100000", "--ckpt-every", "0",
                                             "--pg-timeout", "600"] + extra), preflight=False)
    return ctl


async def _verdict_after_stall(ctl) -> dict:
    """The verdict the controller takes by itself once the ranks stall."""
    ranks, n = ctl.state.ranks, len(ctl.inventory.hosts)
    await wait_for(lambda: len(ranks) == n and all(r.state == "stalled" for r in ranks.values()),
                   TIMEOUT, "every rank stalled")
    await wait_for(lambda: ctl.state.verdict is not None, 60, "a verdict after the stall")
    return ctl.state.verdict


async def test_a_rank_stuck_in_python_is_named_with_its_node_and_line(tmp_path):
    # 2 nodes: rank 1 hangs, rank 0 waits (each node more is its start-up's time)
    ctl = await _launch(tmp_path, ["--hang-at-step", "6", "--hang-rank", "1"], n=2)
    try:
        verdict = await _verdict_after_stall(ctl)
        assert verdict["kind"] == "stuck-in-python", verdict
        assert [s["rank"] for s in verdict["suspects"]] == [1], verdict
        suspect = verdict["suspects"][0]
        assert suspect["node"] == ctl.state.ranks[1].node
        # py-spy names the file as the process imported it (here relative to the workdir)
        assert suspect["frame"].endswith("trainer/faults.py:%d in injected_hang"
                                         % line_of("time.sleep(3600)")), suspect
        assert verdict["evidence"]["waiting_ranks"] == [0]
        assert "all_reduce" in verdict["evidence"]["waiting_in"]["op"], verdict["evidence"]
        assert ctl.status()["verdict"] == verdict
        assert any(e.kind == "verdict" for e in ctl.state.events)
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left


async def test_a_rank_in_a_different_collective_is_named(tmp_path):
    ctl = await _launch(tmp_path, ["--mismatch-at-step", "6", "--mismatch-rank", "1"])
    try:
        verdict = await _verdict_after_stall(ctl)
        assert verdict["kind"] == "mismatch", verdict
        assert [(s["rank"], s["node"]) for s in verdict["suspects"]] == \
            [(1, ctl.state.ranks[1].node)], verdict
        assert verdict["suspects"][0]["frame"].endswith(
            "trainer/faults.py:%d in injected_mismatch" % line_of("dist.broadcast(")), verdict
        assert "broadcast" in verdict["evidence"]["collectives"]["1"]["op"]
        assert "all_reduce" in verdict["evidence"]["majority"]["op"]
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left


async def test_a_healthy_run_gets_no_suspect(tmp_path):
    """Steps with 100 ms of idle time in them, as a GPU job's CPU has: with steps of a few ms
    of CPU alone, a rank that shares a core with other work on this 2-core machine does make
    the others wait a third of the time (a straggler in fact, named so on a loaded run)."""
    # 3 nodes: the fewest where one rank could be named the odd one out beside a majority
    # (a straggler, a rank in another collective); each node more is its start-up's time
    ctl = await _launch(tmp_path, ["--idle-s", "0.1"], n=3)
    try:
        ranks = ctl.state.ranks
        await wait_for(lambda: len(ranks) == 3 and all((r.step or 0) > 5 for r in ranks.values()),
                       TIMEOUT, "all ranks stepping")
        for _ in range(3):
            verdict = await ctl.why()
            assert verdict["suspects"] == [], verdict
            assert verdict["kind"] == "unknown", verdict
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
