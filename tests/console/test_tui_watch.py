"""`rankdeck watch`: a read-only TUI over the scripted transport (console/tui/readonly.py).

The agent's own refusal is tested on real agents (tests/agent/test_serve_roles.py,
tests/spine/test_watchers.py); here the console's side: it says read-only in every
connection's hello and in its header, binds, shows and does nothing that changes the run.
"""

from __future__ import annotations

import time

import pytest

from console.tui.app import RankdeckApp
from console.tui.help import key_sections
from console.tui.readonly import changes_run
from console.tui.stacks import StacksScreen

from tests.waits import wait_until
from tests.console.scripted import controller, host_names, standard_script
from tests.console.test_tui import SIZE, running

pytestmark = pytest.mark.usefixtures("own_home")

CHANGING_KEYS = ("k", "K", "r", "R")


def build(tmp_path, read_only: bool):
    t = standard_script(host_names(4), t0=time.time()).transport()
    ctl, launch = controller(str(tmp_path), t, steps=40)  # a stand-in for a run already going
    ctl.me.read_only = read_only
    return RankdeckApp(ctl, launch), ctl, t


def changing_shown(app) -> list[str]:
    """The keys that change the run which the footer shows or the help lists."""
    footer = [key for key, active in app.screen.active_bindings.items()
              if changes_run(active.binding.action) and active.binding.show]
    helped = [d for _t, rows in key_sections(app) for _k, d in rows
              if d.startswith(("Kill", "Restart"))]
    return footer + helped


async def test_a_driving_console_has_the_keys_the_watcher_lacks(tmp_path):
    app, _ctl, t = build(tmp_path, read_only=False)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        assert len(changing_shown(app)) >= 4  # the footer's kill and restart keys, the help's
        assert "READ-ONLY" not in app.header.info().plain
        assert {r.args.get("role") for r in t.requests if r.op == "hello"} == {"drive"}


async def test_a_watcher_binds_shows_and_does_nothing_that_changes_the_run(tmp_path):
    app, ctl, t = build(tmp_path, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        assert [r.args.get("role") for r in t.requests if r.op == "hello"] == ["watch"] * 4
        assert "READ-ONLY" in app.header.info().plain
        assert changing_shown(app) == []
        app.nodes.focus()
        app.nodes.move_to("n:node2")
        for key in CHANGING_KEYS:
            await pilot.press(key, "y")
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, StacksScreen), what="stacks")
        hint = app.screen.query("Static").last().render()
        assert "restart" not in str(hint) and "r" not in app.screen.active_bindings
        await pilot.press("r", "y", "escape")
        await pilot.pause()
        assert t.ops("stop") == [] and t.ops("restart") == []
        app.ask("stop", "node2")  # the backstop, as a palette command would call it
        await pilot.pause()
        assert t.ops("stop") == []
        assert not [c.title for c in app.get_system_commands(app.screen)
                    if c.title.startswith(("Kill", "Restart"))]
        assert ctl.state.nodes["node2"].state == "running"
