"""Issue 29: a rank whose loss went inf or NaN is marked in the nodes table (``NaN@12`` in
red) on its row, and on its node's row when the node is folded; other ranks are not."""

from __future__ import annotations

import time

from console.model.state import RunState
from console.tui.app import RankdeckApp
from console.tui.nodes import DIVERGED_STYLE, NodesTable
from tests.waits import wait_until
from tests.console.scripted import controller, host_names, standard_script

T0 = 1_700_000_000.0


def diverged_state() -> RunState:
    state = RunState("r", [("node0", "10.0.0.1"), ("node1", "10.0.0.2")])
    for node, fid_rank in (("node0", (0, 1)), ("node1", (2, 3))):
        for rank in fid_rank:
            state.apply_records(node, [[{"k": "file", "f": rank + 1, "rank": rank,
                                         "local_rank": rank % 2, "attempt": 0, "instance": "i",
                                         "stream": "stdout", "world_size": 4, "ts": T0}]], 0)
            for step in range(10, 13):
                loss = float("nan") if rank == 3 and step >= 12 else 1.0 / step
                state.apply_records(node, [[{"k": "metric", "f": rank + 1, "step": step,
                                             "loss": loss, "ts": T0 + step}]], 0)
    return state


def text_of(table: NodesTable, key: str) -> list[tuple[str, str]]:
    return [piece for line in table.row_lines(key) for piece in line]


def test_a_diverged_rank_and_its_folded_node_show_where_it_diverged():
    state = diverged_state()
    assert state.ranks[3].diverged == 12
    table = NodesTable(state)
    table.folded = False
    table.refresh_rows()
    assert ("NaN@12  ", DIVERGED_STYLE) in text_of(table, "r:3")
    for key in ("r:0", "r:1", "r:2", "n:node0", "n:node1"):
        assert not any("NaN" in text for text, _style in text_of(table, key)), key
    table.folded = True
    table.refresh_rows()
    assert ("NaN@12 r3  ", DIVERGED_STYLE) in text_of(table, "n:node1")
    assert not any("NaN" in text for text, _style in text_of(table, "n:node0"))


async def test_the_app_shows_the_mark(tmp_path):
    """In the real app, on a scripted run whose rank 1 then reports an inf loss."""
    hosts = host_names(2)
    t = standard_script(hosts, t0=time.time()).transport()
    ctl, launch = controller(str(tmp_path), t, hosts=2)
    app = RankdeckApp(ctl, launch)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_until(pilot, lambda: not app.launching, what="launch")
        await wait_until(pilot, lambda: 1 in ctl.state.ranks and ctl.state.ranks[1].step,
                         what="rank 1 steps")
        node = ctl.state.ranks[1].node
        fid = next(f for f, fi in ctl.state.nodes[node].files.items() if fi.rank == 1)
        ctl.state.apply_records(node, [[{"k": "metric", "f": fid, "step": 7,
                                         "loss": float("inf")}]], 0)
        # the table may not hold rank 1's row yet (it is refreshed on a timer): no row is no mark
        await wait_until(pilot, lambda: "NaN@7" in "".join(app.nodes.row_text("r:1")),
                         what="the mark on rank 1's row")
        assert app.nodes.row_text("r:0") and "NaN" not in "".join(app.nodes.row_text("r:0"))
