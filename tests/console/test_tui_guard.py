"""One value a widget cannot show costs its cell (`n/a`), never the app (console/tui/guard.py);
and a diverged loss never reaches the chart."""

from __future__ import annotations

import math

from textual.app import App, ComposeResult

from console.model.buffers import Series
from console.model.state import RunState
from console.model.nodes import RankState
from console.tui import losschart
from console.tui.header import RunHeader
from console.tui.losschart import LossChart
from console.tui.rowsview import RowsView

from tests.waits import wait_until


class Rows(RowsView):
    def row_lines(self, key: str) -> tuple:
        if key == "n:bad":
            raise ValueError("a value no formatter takes")
        return ((("row %s" % key, ""),),)


class Shelf(App):
    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        yield RunHeader(self.state)
        yield LossChart(self.state)
        yield Rows()


async def test_a_widget_that_cannot_show_a_value_shows_na_and_the_app_goes_on(monkeypatch):
    state = RunState("r1", [("node0", "127.0.0.2")])
    app = Shelf(state)

    def broken_plot(*_args):
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(losschart, "plot", broken_plot)
    async with app.run_test(size=(100, 30)) as pilot:
        rows = app.query_one(Rows)
        rows.set_shape(["n:good", "n:bad"], [1, 1])
        rows.invalidate()
        state.ranks[0] = RankState(0, "node0")
        state.ranks[0].points.append((1, 2.5))
        state.ranks[0].points.append((2, 2.0))
        state.started = "not a time"  # the header's elapsed time cannot be computed
        app.query_one(LossChart).refresh()
        app.query_one(RunHeader).update_info()
        chart, header = app.query_one(LossChart), app.query_one(RunHeader)
        await wait_until(pilot, lambda: chart.size.width > 0, what="the chart laid out")
        await pilot.pause()  # a frame drawn with every guarded widget on screen
        assert str(chart.render()) == "loss vs step: n/a"
        assert [str(t) for line in rows.lines_of("n:bad") for t, _s in line] == ["bad n/a"]
        assert rows.lines_of("n:good") == ((("row n:good", ""),),)
        assert str(header.info()).startswith("rankdeck run r1") and "n/a" in str(header.info())
        assert app.is_running


def test_a_series_keeps_only_finite_points():
    series = Series()
    for point in [(1, 2.5), (2, math.inf), (3, math.nan), (4, -math.inf), (5, 1.5)]:
        series.append(point)
    assert list(series) == [(1, 2.5), (5, 1.5)]
