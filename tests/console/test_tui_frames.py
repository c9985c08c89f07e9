"""What a state change redraws at once (keys waited behind heavy frames: docs/BENCHMARKS.md, "The view").

At 512 ranks the nodes table, the GPU panel and the loss chart redrawn in one frame took
70-90 ms, and a key pressed meanwhile waited for all of it. A state change now redraws them
a turn apart (bench/tui.py measures the time; this counts calls).
"""

from __future__ import annotations

import time

import pytest

from console.tui.app import RankdeckApp
from console.tui.messages import RunChanged
from tests.waits import wait_until as until
from tests.console.scripted import controller, gpu_snapshot, host_names, standard_script

pytestmark = pytest.mark.usefixtures("own_home")

HOSTS, NPROC = 4, 2


def scripted_app(tmp_path):
    """(controller, app) of a scripted run of HOSTS x NPROC ranks, not yet started."""
    hosts = host_names(HOSTS)
    script = standard_script(hosts, NPROC, t0=time.time())
    ctl, launch = controller(str(tmp_path), script.transport(), hosts=HOSTS, slots=NPROC)
    return ctl, RankdeckApp(ctl, launch)


async def test_a_state_change_redraws_the_large_widgets_a_turn_apart(tmp_path):
    """The handler redraws the nodes table at once and leaves the GPU panel and the chart
    to timers, one each; checked by holding the timers (no frame timing: a loaded machine
    can stall past any gap), then letting them run."""
    hosts = host_names(HOSTS)
    script = standard_script(hosts, NPROC, t0=time.time())
    transport = script.transport(gpus={h: gpu_snapshot(NPROC) for h in hosts})
    ctl, launch = controller(str(tmp_path), transport, hosts=HOSTS, slots=NPROC)
    app = RankdeckApp(ctl, launch)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: not app.launching, what="launch")
        await until(pilot, lambda: app.gpus.row_text("node4"), what="the GPU rows")
        await pilot.pause(1.0)  # the feed's last refresh is done
        calls: list[str] = []
        for name, widget, method in (("nodes", app.nodes, "refresh_rows"),
                                     ("gpus", app.gpus, "refresh_rows"),
                                     ("chart", app.chart, "update_chart")):
            real = getattr(widget, method)
            setattr(widget, method, lambda real=real, name=name: (calls.append(name), real()))
        held: list = []
        app.set_timer = lambda delay, callback, *a, **k: held.append((delay, callback))
        app.on_run_changed(RunChanged())
        assert calls == ["nodes"], calls  # the rest waits for a later turn
        while held:
            delay, callback = held.pop(0)
            assert delay > 0
            callback()
        assert calls == ["nodes", "gpus", "chart"], calls
        del app.set_timer  # the class's own again
        await pilot.pause(0.3)
        assert app.nodes.row_values("n:node4")[2] == "24"  # the rows show the state


@pytest.mark.parametrize("keys", [["right_square_bracket"], ["n"],
                                  ["g", *"node2", "enter"], ["enter"]],
                         ids=["next-rank", "cycle", "goto", "nodes-table-enter"])
async def test_a_rank_switch_is_drawn_by_the_key_not_by_the_next_timer_tick(tmp_path, keys):
    """``]``, ``n``, a goto and Enter on the nodes table draw their frame at once
    (console/tui/frames.py): checked with the screen's update timer held, so that no other
    frame can come; before, the switch waited for it."""
    ctl, app = scripted_app(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: not app.launching, what="launch")
        await until(pilot, lambda: len(ctl.state.ranks) == HOSTS * NPROC, what="the ranks")
        await pilot.pause(0.5)
        screen = app.screen
        pane = app.logs.active_pane
        before = pane.source
        drawn: list = []
        display = app._display
        app._display = lambda s, update: (drawn.append(pane.source), display(s, update))
        screen._update_timer.resume = lambda: None  # no frame but the key's own
        try:
            await pilot.press(*keys)
            assert pane.source != before
            assert drawn and drawn[-1] == pane.source
            assert not pane.view._repaint_required  # drawn: not to be drawn again
        finally:
            del screen._update_timer.resume
            del app._display


async def test_the_footer_is_rebuilt_only_when_its_keys_change(tmp_path):
    """Focus moving between the panes and the nodes table (the same keys) leaves the footer
    as it is; into the prompt (where `/ g ! [ ] n` are text) rebuilds it without them."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey

    ctl, app = scripted_app(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: not app.launching, what="launch")
        footer = app.query_one(Footer)
        app.logs.focus_pane(0)
        built = None
        for _ in range(40):  # until the rebuilds the start asked for are done (a loaded host)
            await pilot.pause(0.5)
            if footer.query(FooterKey) and footer.query(FooterKey).first() is built:
                break
            built = footer.query(FooterKey).first() if footer.query(FooterKey) else None
        assert built is not None, "the footer never settled"
        for widget in (app.logs.panes[1].view, app.nodes):
            widget.focus()
            await pilot.pause(0.5)
            assert app.focused is widget
            assert footer.query(FooterKey).first() is built, "rebuilt for the same keys"
        await pilot.press("slash")
        await until(pilot, lambda: footer.query(FooterKey).first() is not built,
                    what="the footer rebuilt for the prompt's keys")
        assert app.focused is app.prompt
        shown = {key.action for key in footer.query(FooterKey)} - {"command_palette"}
        assert shown == {keys[1] for keys in footer.shown_keys()[1:]}, shown  # [0]: its width
        assert not shown & {"step(1)", "cycle_source", "goto"}, shown  # text in the prompt
