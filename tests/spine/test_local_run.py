"""The spine with real parts: 2 local nodes (of 2 ranks each for a whole run, of 1 for a crash
and a restart), real torchrun, the reference trainer on CPU.

Each test starts its own run (about 15-25 s of torch start-up, ~14 CPU-s a node) and makes
sure nothing of it is left afterwards, whatever the outcome. None is about preflight (it
imports torch on every host): a launch with preflight is tests/e2e/test_ssh_run.py's.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agent.host import procs
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from tests.cli import rankdeck
from tests.waits import wait_for

from .helpers import (TINY, TRAINER, assert_arrived_once, collect_lines,
                      local_inventory, processes_of, rank_log_files, wind_down)

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 300


@pytest.fixture
async def controller2(tmp_path):
    """A controller over 2 local nodes; on the way out, stop whatever is still running."""
    async for ctl in _controller(tmp_path, 2):
        yield ctl


async def _controller(tmp_path, n: int):
    ctl = RunController(local_inventory(tmp_path / "work", n=n), LocalTransport(),
                        History())  # under the test's XDG_STATE_HOME, as the CLI finds it
    yield ctl
    left = await wind_down(ctl)
    assert not left, "processes left behind: %s" % left


async def test_run_to_completion_delivers_every_line_exactly_once(controller2, tmp_path):
    ctl = controller2
    got = collect_lines(ctl)
    events = []
    ctl.state.event_listeners.append(events.append)
    steps = 12
    # 4 ranks on 2 nodes of 2: two ranks' files a node, two nodes' journals and links
    await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0, nproc_per_node=2,
                                args=TINY + ["--steps", str(steps), "--ckpt-every", "5"]),
                     preflight=False)
    final = await asyncio.wait_for(ctl.wait_done(), RUN_TIMEOUT)
    await ctl.stop_store()
    assert final == "succeeded", ctl.state.status()

    work = tmp_path / "work"
    for node in ctl.state.nodes:
        files = rank_log_files(work, ctl.run_id, node)
        assert any(f.endswith("stdout.log") for f in files), files
        for path in files:
            assert_arrived_once(got, node, path)

    status = ctl.state.status()
    assert [n["exit_code"] for n in status["nodes"]] == [0, 0]
    assert sorted(ctl.state.ranks) == [0, 1, 2, 3]
    for rank in ctl.state.ranks.values():
        assert [s for s, _loss in rank.points] == list(range(1, steps + 1)), rank.rank
        assert all(loss == loss and loss > 0 for _s, loss in rank.points)  # not NaN
    ckpts = [e for e in events if e.kind == "checkpoint"]
    for node in ctl.state.nodes:  # local rank 0 of every node saves at 5, 10 and the end
        saved = sorted(int(re.search(r"step (\d+)", e.text).group(1)) for e in ckpts
                       if e.node == node)
        assert saved == [5, 10, 12], (node, saved)


async def test_crash_on_one_rank_names_the_rank_and_the_cause(controller2, tmp_path):
    ctl = controller2
    await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0,
                                args=TINY + ["--steps", "50", "--crash-at-step", "4",
                                             "--crash-rank", "1"]), preflight=False)
    final = await asyncio.wait_for(ctl.wait_done(), RUN_TIMEOUT)
    await ctl.stop_store()
    assert final == "failed"
    crashed = [n for n in ctl.state.nodes.values() if n.cause and "injected crash" in n.cause]
    assert len(crashed) == 1, [(n.name, n.state, n.cause) for n in ctl.state.nodes.values()]
    node = crashed[0]
    assert node.state == "failed" and node.exit_code not in (0, None)
    assert ctl.state.ranks[1].node == node.name
    assert ctl.state.ranks[1].state == "failed"

    # The same through the CLI, from the run history: exit code and status --json.
    out = rankdeck("status", ctl.run_id, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["state"] == "failed"
    bad = [n for n in doc["nodes"] if n["name"] == node.name][0]
    assert "injected crash at step 4 on rank 1" in bad["cause"]
    assert [r["state"] for r in bad["ranks"]] == ["failed"]


async def test_restart_a_node_resumes_from_checkpoint_then_stop_leaves_nothing(
        controller2, tmp_path):
    ctl = controller2
    got = collect_lines(ctl)
    await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=2, grace=5,
                                args=TINY + ["--steps", "100000", "--ckpt-every", "5"]),
                     preflight=False)
    ranks = ctl.state.ranks
    await wait_for(lambda: len(ranks) == 2 and all((r.step or 0) >= 7 for r in ranks.values()),
                   RUN_TIMEOUT, "all ranks past the step-5 checkpoint")

    res = await ctl.restart("node1")
    assert res["node1"]["launches"] == 2, res
    # its old torchrun, gone, taken out of the rendezvous by the store (console/surgery/expel.py); on
    # a loaded host it may exit so slowly that its entry has expired and a survivor's sync
    # removed it first, which the store tells apart from an entry it cannot find
    assert any(e.kind == "rendezvous" and e.node == "node1" and (
        "taken out of the rendezvous at once" in e.text or ": gone already (" in e.text)
        for e in ctl.state.events), [e.text for e in ctl.state.events]

    def resumed_lines():
        text = b"".join(d for chunks in got.values() for _o, d in chunks).decode(
            "utf-8", "replace")
        return re.findall(r"resumed step=(\d+)", text)

    # every rank (node0's too: its worker restarts on the membership change)
    await wait_for(lambda: len(resumed_lines()) >= 2, RUN_TIMEOUT, "2 ranks resumed")
    # the newest checkpoint: step 5, 10, ... or the one the trainer saved on SIGTERM
    resumed_at = max(int(s) for s in resumed_lines())
    assert resumed_at >= 7
    await wait_for(lambda: all((r.step or 0) > resumed_at + 2 and r.state == "running"
                               for r in ranks.values()), RUN_TIMEOUT, "all ranks stepping again")
    for rs in ranks.values():  # each rank's worker pid (the GPU panel matches it to NVML's)
        assert procs.environ(rs.pid).get("RANK") == str(rs.rank), (rs.rank, rs.pid)
    node1 = ctl.state.nodes["node1"]
    assert node1.restarts == 1 and node1.restarts_used == 1
    assert ctl.state.nodes["node0"].restarts == 0

    results = await ctl.stop()
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert all(r["state"] == "stopped" and r["left"] == [] for r in results.values()), results
    assert processes_of(ctl.run_id) == []
    # `rankdeck ls` says so at once, with no console left to save the run's status
    assert History().load(ctl.run_id)["state"] == "stopped"
    again = await ctl.stop()  # harmless
    assert all(r["state"] == "stopped" for r in again.values()), again
