"""The view under text it does not control: markup typed into a prompt or sent by a host
must show as text, never end the app; an invalid regex keeps the prompt open and says why."""

from __future__ import annotations

import time

import pytest

from console.tui.app import RankdeckApp

from tests.console.scripted import controller, host_names, standard_script
from tests.console.settle import screen_text
from tests.waits import wait_until

pytestmark = pytest.mark.usefixtures("own_home")

SIZE = (160, 48)
MARKUP = "[/x]"
HOST_MARKUP = "cannot source [/opt/site/env.sh] [bold]x[/]"


def build(tmp_path, **transport):
    script = standard_script(host_names(4), t0=time.time())
    ctl, launch = controller(str(tmp_path), script.transport(**transport), steps=40)
    return RankdeckApp(ctl, launch), ctl


async def running(pilot, app) -> None:
    await wait_until(pilot, lambda: not app.launching, what="launch")
    await wait_until(pilot, lambda: app.logs.panes[0].view.lines_text(), what="pane lines")


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_markup_typed_into_goto_is_shown_as_text(tmp_path):
    app, ctl = build(tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await running(pilot, app)
        await pilot.press("g", *MARKUP, "enter")
        await wait_until(pilot, lambda: any(MARKUP in m for m in messages(app)),
                         what="the goto error")
        # the toast is drawn: a markup error would end the app here
        await wait_until(pilot, lambda: MARKUP in screen_text(app), what="the toast drawn")
        assert app.is_running
        await pilot.press("q")


async def test_markup_typed_into_the_filter_is_a_filter(tmp_path):
    app, ctl = build(tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await running(pilot, app)
        await pilot.press("slash", *MARKUP, "enter")
        await wait_until(pilot, lambda: app.logs.pattern is not None, what="the filter")
        assert app.logs.pattern.pattern == MARKUP
        # the pane titles show the pattern: drawn as text, a markup error would end the app
        await wait_until(pilot, lambda: "/%s/" % MARKUP in screen_text(app),
                         what="the pattern drawn in the pane titles")
        assert app.is_running
        await pilot.press("q")


async def test_an_invalid_regex_shows_and_enter_keeps_the_prompt_open(tmp_path):
    app, ctl = build(tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await running(pilot, app)
        await pilot.press("slash", "[")
        await wait_until(pilot, lambda: app.prompt.has_class("-invalid"), what="marked invalid")
        await pilot.press("enter")
        await wait_until(pilot, lambda: any("not a valid regular expression" in m
                                            for m in messages(app)), what="Enter's answer")
        assert app.prompt.has_class("-shown"), "Enter on an invalid regex closed the prompt"
        assert app.focused is app.prompt
        assert app.prompt.has_class("-invalid")
        assert app.is_running
        await pilot.press("backspace", "enter")  # now valid (empty): Enter closes it
        await wait_until(pilot, lambda: not app.prompt.has_class("-shown"), what="closed")
        await pilot.press("q")


async def test_a_host_message_with_markup_during_launch_is_shown_as_text(tmp_path):
    app, ctl = build(tmp_path, unreachable={"node3": ("agent-failed",
                                                      "node3: " + HOST_MARKUP)})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: not app.launching, what="launch to fail")
        await wait_until(pilot, lambda: any("/opt/site/env.sh" in m for m in messages(app)),
                         what="the launch error")
        await wait_until(pilot, lambda: "/opt/site/env.sh" in screen_text(app),
                         what="the toast drawn")
        assert app.is_running
        assert any(HOST_MARKUP in m for m in messages(app))
        await pilot.press("q")
