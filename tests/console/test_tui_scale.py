"""The nodes table at 64 nodes x 8 ranks (scripted transport): folded rows, order, the worst row.

No timings here (bench/tui.py measures those): what a user sees and where the keys take them.
"""

from __future__ import annotations

import time

import pytest

from console.tui.app import RankdeckApp
from console.tui.confirm import ConfirmScreen
from tests.waits import wait_until
from tests.console.scripted import RunScript, controller, host_names
from tests.console.settle import settled

pytestmark = pytest.mark.usefixtures("own_home")

SIZE = (160, 48)
HOSTS, NPROC = 64, 8
BEHIND, SLOW, CRASHED = 100, 300, 394  # ranks: on node13, node38, node50


def one_step(script: RunScript, rank: int, step: int, step_time: float, ts: float) -> None:
    """A step line and its metric from one rank only."""
    node, lr = script.hosts[rank // script.nproc], rank % script.nproc
    script.lines(node, lr, ["step %d loss=1.0 step_time=%.3fs" % (step, step_time)], ts)
    script.recs[node].append([{"k": "metric", "f": lr, "step": step, "loss": 1.0,
                               "step_time": step_time, "ts": ts}])


def big_run(t0: float, last: float | None = None) -> RunScript:
    """512 ranks at step 4 (taken at ``last``), except rank BEHIND (still at 3, taken at
    ``t0`` + 11.5); rank SLOW steps in 0.9 s."""
    script = RunScript(host_names(HOSTS), NPROC, t0=t0).launched()
    script.steps(1, 3)
    for rank in range(HOSTS * NPROC):
        if rank != BEHIND:
            one_step(script, rank, 4, 0.9 if rank == SLOW else 0.5, last or t0 + 13)
    return script


def build(tmp_path, script: RunScript):
    t = script.transport()
    ctl, launch = controller(str(tmp_path), t, hosts=HOSTS, slots=NPROC)
    return RankdeckApp(ctl, launch), t


async def stepping(pilot, app) -> None:
    await wait_until(pilot, lambda: not app.launching, timeout=60, what="launch")
    await wait_until(pilot, lambda: (app.nodes.row_values("n:node64") or ("",) * 3)[2] == "4",
                     timeout=60, what="every node at step 4")
    await settled(pilot)  # and a state refresh after the last metric


def rows(app) -> list[str]:
    return list(app.nodes._keys)


def header(app) -> str:
    return app.nodes.header[0][0]


async def test_nodes_fold_to_one_row_each_and_open_with_keys(tmp_path):
    app, _t = build(tmp_path, big_run(time.time()))
    async with app.run_test(size=SIZE) as pilot:
        await stepping(pilot, app)
        assert rows(app) == ["n:node%d" % (i + 1) for i in range(HOSTS)]
        assert app.nodes.row_text("n:node1")[0].startswith("▸ node1 ")
        app.nodes.focus()
        app.nodes.move_to("n:node2")
        await pilot.press("e")
        assert rows(app)[:11] == ["n:node1", "n:node2"] + ["r:%d" % r for r in range(8, 16)] \
            + ["n:node3"]
        assert app.nodes.row_text("n:node2")[0].startswith("▾ node2 ")
        await pilot.press("down", "e")  # on a rank row: folds its node, the cursor goes to it
        assert len(rows(app)) == HOSTS and app.nodes.cursor_key == "n:node2"
        await pilot.press("E")
        assert len(rows(app)) == HOSTS * (NPROC + 1)
        await pilot.press("E")
        assert len(rows(app)) == HOSTS


async def test_a_folded_node_names_its_odd_rank_and_the_worst_key_finds_it(tmp_path):
    now = time.time()
    app, _t = build(tmp_path, big_run(now - 100, last=now))  # BEHIND: no step for 88 s
    async with app.run_test(size=SIZE) as pilot:
        await stepping(pilot, app)
        await wait_until(pilot, lambda: app.ctl.state.ranks[BEHIND].state == "stalled",
                         what="rank BEHIND stalled")
        await wait_until(pilot, lambda: "1 stalled: r%d  " % BEHIND in
                         "".join(app.nodes.row_text("n:node13")),
                         what="the stalled rank named on its node's row")
        # the stall's verdict puts the cursor on its suspect's node when it comes (the
        # scripted agents name node1): after it, so that it does not move the cursor `!` set
        # (CI saw the cursor on node1)
        await wait_until(pilot, lambda: app.ctl.state.verdict is not None, what="the verdict")
        await pilot.press("exclamation_mark")  # stalled beats the slowest step time
        await wait_until(pilot, lambda: app.nodes.cursor_key == "r:%d" % BEHIND,
                         what=lambda: "the cursor on r%d; it is on %s, node1 %s" % (
                             BEHIND, app.nodes.cursor_key, app.nodes.row_values("n:node1")))


async def test_order_cycles_and_the_header_says_by_what(tmp_path):
    app, _t = build(tmp_path, big_run(time.time()))
    async with app.run_test(size=SIZE) as pilot:
        await stepping(pilot, app)
        app.nodes.focus()
        assert "▼" not in header(app)
        await pilot.press("o")
        assert app.nodes.order == "state" and "state▼" in header(app)
        await pilot.press("o")
        assert "step▼" in header(app)
        assert rows(app)[0] == "n:node13"  # rank BEHIND's node
        await pilot.press("o")
        assert "s/step▼" in header(app)
        assert rows(app)[0] == "n:node38"  # rank SLOW's node
        app.nodes.set_open("node38", True)
        assert rows(app)[1] == "r:%d" % SLOW
        for _ in range(8):  # the telemetry orders (nodeorder.py), then back to node
            await pilot.press("o")
            if app.nodes.order == "node":
                break
        assert app.nodes.order == "node" and rows(app)[0] == "n:node1"


async def test_worst_key_goes_to_the_failed_rank_else_the_slowest(tmp_path):
    t0 = time.time()
    app, t = build(tmp_path, big_run(t0))
    async with app.run_test(size=SIZE) as pilot:
        await stepping(pilot, app)
        app.logs.focus_pane(0)
        await pilot.press("exclamation_mark")
        assert app.focused is app.nodes
        assert app.nodes.cursor_key == "r:%d" % SLOW  # its node opened to show it
        assert app.nodes.is_open("node38") and not app.nodes.is_open("node1")
        crash = RunScript(host_names(HOSTS), NPROC, t0=t0)
        crash.offsets = {("node50", 2): 10_000}
        crash.crash("node50", 2, 1, "CUDA error: an illegal memory access", time.time())
        t.node("node50").append(crash.recs["node50"])
        await wait_until(pilot, lambda: app.nodes.row_values("n:node50")[1].startswith("failed"),
                         what="node50 failed")
        await pilot.press("exclamation_mark")
        assert app.nodes.cursor_key == "r:%d" % CRASHED
        await pilot.press("r")  # restart acts on the worst row's node
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirmation")
        assert "node50" in app.screen.title_text
