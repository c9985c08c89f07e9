"""Node surgery with real torchrun and the real TUI (docs/SURGERY.md): 4 local hosts, 3 in
the run and one spare that hosts the rendezvous store and the judge. Rank 2 hangs; `c` on its
node's row and `y` put the spare in and every rank steps again from the checkpoint; node0 goes
out next and the elastic run (--nnodes 2:3) shrinks; a third cordon would go below 2 and is
refused with nothing changed; uncordon makes the hung rank's node a spare again.

3 in the run, not more: each node more is its torchrun's and worker's start-up at launch and
again at each of the two membership changes, and none of the steps needs a fourth (the
spare's way in, a shrink that keeps a multi-node world, the refusal at the minimum)."""

from __future__ import annotations

import functools
import os
import re

import pytest

from agent.host import actions, procs
from console.surgery.cordon import cordon, uncordon
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.model.summary import node_detail
from console.transport.local import LocalTransport
from console.tui.app import RankdeckApp
from console.tui.confirm import ConfirmScreen

from tests.waits import wait_until

from .helpers import (TINY, TRAINER, assert_arrived_once, collect_lines, local_inventory,
                      node_dir, processes_of, rank_log_files, wind_down)

pytestmark = pytest.mark.e2e
TIMEOUT = 300
SIZE = (160, 48)
until = functools.partial(wait_until, timeout=TIMEOUT, every=0.2)  # real runs: slower


def seen(st) -> str:
    """What the run looked like, for a wait that timed out."""
    return "world %s; ranks %s; nodes %s; events %s" % (
        st.world_size, [(r.rank, r.node, r.state, r.step) for r in st.ranks.values()],
        {n: ns.state for n, ns in st.nodes.items()},
        [(e.node, e.kind, e.text[:80]) for e in list(st.events)[-25:]])


def of_node(run_id: str, node: str) -> list:
    """The live processes marked as ``node``'s of the run (the agent's kill marker)."""
    return [(pid, cmd) for pid, cmd in processes_of(run_id)
            if procs.environ(pid).get(procs.MARKER) == "%s/%s" % (run_id, node)]


def torchruns(run_id: str, node: str) -> list[int]:
    """The pids of ``node``'s torchruns in the run."""
    return [pid for pid, cmd in of_node(run_id, node) if "torch.distributed.run" in cmd]


async def test_cordon_puts_the_spare_in_then_shrinks_then_refuses(tmp_path):
    work = tmp_path / "work"
    inv = local_inventory(work, n=4)
    inv.hosts[3].spare = True
    ctl = RunController(inv, LocalTransport(), History())
    st = ctl.state
    got = collect_lines(ctl)
    spec = LaunchSpec(script=TRAINER, nnodes="2:3", max_restarts=5, grace=3, stall_after=6.0,
                      args=TINY + ["--steps", "100000", "--ckpt-every", "4",
                                   "--hang-at-step", "6", "--hang-rank", "2",
                                   "--pg-timeout", "600",
                                   # shared, as a spare needs: the hang's fired marker is
                                   # seen on every node
                                   "--ckpt-dir", str(work / "ckpt")])
    app = RankdeckApp(ctl, lambda: ctl.launch(spec, preflight=False))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(st.ranks) == 3 and all(
                r.state == "stalled" for r in st.ranks.values()),
                what="every rank stalled behind the hung rank 2")
            # the store and the judge live on the spare, which runs no torchrun
            assert ctl.record["rdzv_host"] == "node3" and ctl.judge_host() == "node3"
            assert st.nodes["node3"].state == "spare"
            # a warm spare: its torchrun started at launch, held before the rendezvous
            assert any(e.node == "node3" and "is a warm spare" in e.text for e in st.events), \
                seen(st)
            assert node_detail(st, st.nodes["node3"]) == "warm"  # its row says so
            held = torchruns(ctl.run_id, "node3")
            assert len(held) == 1, of_node(ctl.run_id, "node3")
            hung = st.ranks[2].node
            await until(pilot, lambda: st.checkpoints.last_complete() is not None,
                        what="the step-4 checkpoint complete")

            app.nodes.focus()
            app.nodes.move_to("n:" + hung)
            await pilot.press("c")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="preview")
            preview = app.screen.body
            assert "node3 (spare" in preview, preview
            # the hung rank's node goes out with its rank(s) (which ones, right after the
            # elastic start's membership change, is the console's latest view: not asserted)
            assert re.search(r"ranks? [0-9,-]+ leave %s;" % hung, preview), preview
            assert "step 4" in preview, preview
            await pilot.press("y")
            await until(pilot, lambda: any(s.get("outcome") != "started" for s in
                                           ctl.record.get("surgeries", [])),
                        what="the cordon's outcome")
            entry = ctl.record["surgeries"][0]
            assert entry["outcome"] == "done" and entry["left"] == [], entry
            assert entry["gpu"] == "no GPU", entry  # a CPU host: said, not left out
            # its dead torchrun taken out of the rendezvous by the store (agent/surgery/expel.py)
            assert entry["expelled"] == "done", entry
            # ... and kept in the store host's action log, with who asked it (agent/host/actions.py)
            logged, _end = actions.read(node_dir(work, ctl.run_id, "node3"))
            assert [(e["node"], e["result"]) for e in logged if e["action"] == "expel"] == [
                ("node3", "ok")] and "%s's dead torchrun" % hung in str(logged), logged
            assert "@" in entry["who"]
            # the held torchrun went in, not a new one
            assert any(e.node == "node3" and "put in warm" in e.text for e in st.events)
            assert torchruns(ctl.run_id, "node3") == held
            assert st.nodes[hung].state == "cordoned"
            assert not of_node(ctl.run_id, hung), of_node(ctl.run_id, hung)
            # every rank was stalled behind the hung one: the other nodes' workers were
            # killed (their torchruns start them again) rather than left to fail slowly
            assert {e.node for e in st.events if e.kind == "surgery" and
                    "stalled with %s, killed" % hung in e.text} == \
                {"node0", "node1", "node2"} - {hung}, seen(st)

            await until(pilot, lambda: st.world_size == 3 and any(
                r.node == "node3" for r in st.ranks.values()) and all(
                r.state == "running" and (r.step or 0) > 8 for r in st.ranks.values()),
                what=lambda: "3 ranks, one on the spare, stepping past the hang: " + seen(st))
            assert st.checkpoints.resumed["node3"].step == 4, st.checkpoints.resumed
            assert not of_node(ctl.run_id, hung)
            # fenced: a restart of the cordoned node is refused, by the console and its agent
            res = await ctl.restart(hung)
            assert "cordoned" in str(res[hung])
            with pytest.raises(Exception, match="cordoned"):
                await ctl.links[hung].request("restart", run_root=ctl.links[hung].run_root,
                                              node=hung, spec={"run_id": ctl.run_id})
            assert History().load(ctl.run_id)["surgeries"][0]["outcome"] == "done"
            await until(pilot, lambda: any(e.kind == "surgery" and "done" in e.text
                                           for e in st.events), what="the surgery event")

            # node0 out with no spare left: the run shrinks to 2 and goes on
            plan = ctl.cordon_plan("node0")
            assert plan.refusal is None and plan.shrink and plan.active_after == 2
            assert (await cordon(ctl, plan, who="tester@laptop"))["outcome"] == "done"
            # the ranks were stepping: nobody's workers are killed but node0's
            assert not [e for e in st.events if "stalled with node0" in e.text]
            steps = {r.rank: r.step for r in st.ranks.values()}
            await until(pilot, lambda: st.world_size == 2 and len(
                [r for r in st.ranks.values() if r.state == "running" and r.rank < 2 and
                 (r.step or 0) > (steps.get(r.rank) or 0)]) == 2,
                what=lambda: "2 ranks stepping without node0: " + seen(st))

            # one more would leave 1 of --nnodes 2:3: refused, nothing changes
            live = [n for n, ns in st.nodes.items() if ns.role == "active"]
            plan = ctl.cordon_plan(live[0])
            assert plan.refusal and "--nnodes 2:3 needs 2" in plan.refusal
            assert [n for n, ns in st.nodes.items() if ns.role == "active"] == live
            assert not os.path.exists(os.path.join(node_dir(work, ctl.run_id, live[0]),
                                                   "fenced.json"))

            entry = await uncordon(ctl, hung)
            assert entry["outcome"] == "done" and st.nodes[hung].state == "spare"
            assert not os.path.exists(os.path.join(node_dir(work, ctl.run_id, hung),
                                                   "fenced.json"))
            await ctl.stop()
            await ctl.caught_up()
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
    # every line of the cordoned node and of the spare arrived once, in order
    for node in (hung, "node3"):
        for path in rank_log_files(work, ctl.run_id, node):
            assert_arrived_once(got, node, path)
