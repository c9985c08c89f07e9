"""The mouse wheel on a log pane, and the table's cursor following the focus.

Both are handled by Textual's public handlers (``on_mouse_scroll_up``, ``on_focus`` /
``on_blur``) that run before Widget's own, not by overrides of its private ones
(console/tui/internals.py). The wheel goes through the app as the terminal driver sends it.
"""

from __future__ import annotations

import time

import pytest
from textual import events

from console.tui.app import RankdeckApp
from console.model.sources import RANK
from tests.waits import wait_until
from tests.console.scripted import controller, host_names, standard_script

pytestmark = pytest.mark.usefixtures("own_home")

SIZE = (160, 48)
KEPT = 30  # lines a rank kept in memory; the rest is fetched from the node


def long_log_app(tmp_path, kept: int | None = KEPT):
    """(app, transport, every line rank 0 wrote) for a run whose rank 0 wrote 400 lines,
    more than memory keeps (``kept`` lines a rank; None: the default, all of them)."""
    t0 = time.time()
    hosts = host_names(4)
    script = standard_script(hosts, t0=t0)
    script.lines("node1", 0, ["early line %d" % i for i in range(400)], t0 + 30)
    script.steps(41, 45)
    transport = script.transport()
    ctl, launch = controller(str(tmp_path), transport)
    if kept is not None:
        ctl.state.lines_per_rank = kept
    every = "".join(rec[1] for _end, recs in transport.node("node1").journal for rec in recs
                    if rec[0].get("k") == "data" and rec[0]["f"] == 0).split("\n")[:-1]
    return RankdeckApp(ctl, launch), transport, every


async def wheel_up(pilot, widget) -> None:
    """One notch of the wheel over ``widget``, as the terminal's driver posts it."""
    x, y = widget.region.center
    pilot.app.post_message(events.MouseScrollUp(None, x, y, 0, 0, 0, False, False, False,
                                                screen_x=x, screen_y=y))
    await pilot.pause()


async def tail_shown(pilot, app, tail) -> None:
    await wait_until(pilot, lambda: not app.launching, what="launch")
    pane = app.logs.panes[0]
    assert pane.source == (RANK, 0)
    await wait_until(pilot, lambda: pane.view.lines_text() == tail, what="rank 0's tail")
    await wait_until(pilot, lambda: pane.view.max_scroll_y > 0 and pane.view.scroll_y > 0,
                     what="the tail scrolled to")


async def test_the_wheel_up_at_the_top_of_a_log_pane_fetches_older_lines(tmp_path):
    app, transport, every = long_log_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await tail_shown(pilot, app, every[-KEPT:])
        pane = app.logs.panes[0]
        for _ in range(40):  # up to the top: pauses following, and asks for nothing yet
            await wheel_up(pilot, pane.view)
            if pane.view.scroll_y == 0:
                break
        assert pane.view.scroll_y == 0 and not pane.view.follow
        assert not [r for r in transport.requests if r.op == "scrollback"]
        await wheel_up(pilot, pane.view)  # at the top: the node is asked for what came before
        title = pane.query_one(".logpane--title")
        await wait_until(pilot, lambda: "start of log" in str(title.render()), what="older lines")
        assert pane.view.lines_text() == every
        asked = [r for r in transport.requests if r.op == "scrollback"]
        assert asked and all(r.node == "node1" for r in asked)


async def test_a_notch_of_the_wheel_scrolls_a_log_pane_as_far_as_textuals_own(tmp_path):
    """Widget's own wheel handler scrolls once per notch (App.scroll_sensitivity_y lines).
    The override this replaced called it a second time: each notch went twice as far."""
    app, _transport, every = long_log_app(tmp_path, kept=None)
    async with app.run_test(size=SIZE) as pilot:
        await tail_shown(pilot, app, every)
        view = app.logs.panes[0].view
        before = view.scroll_y
        assert before > 2 * app.scroll_sensitivity_y
        await wheel_up(pilot, view)
        assert before - view.scroll_y == app.scroll_sensitivity_y
        assert not view.follow


async def test_the_nodes_tables_cursor_shows_whether_it_has_the_focus(tmp_path):
    hosts = host_names(4)
    ctl, launch = controller(str(tmp_path), standard_script(hosts, t0=time.time()).transport())
    app = RankdeckApp(ctl, launch)

    def cursor_background():
        table = app.nodes
        row = table.cursor + (table.header is not None) - table.scroll_offset.y
        return {s.style.bgcolor for s in table.render_line(row) if s.style and s.text.strip()}

    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.launching, what="launch")
        await wait_until(pilot, lambda: app.nodes.row_values("n:node1"), what="the nodes rows")
        assert app.focused is app.nodes
        focused = cursor_background()
        app.logs.panes[0].view.focus()
        await wait_until(pilot, lambda: cursor_background() != focused, what="the blurred cursor")
        blurred = cursor_background()
        assert len(focused) == len(blurred) == 1, (focused, blurred)
        app.nodes.focus()
        await wait_until(pilot, lambda: cursor_background() == focused, what="the focused cursor")
