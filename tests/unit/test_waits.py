"""The tests' poller (tests/waits.py): it returns what it waited for, fails at its deadline
saying what it waited for, and fails at once when the condition itself fails."""

from __future__ import annotations

import asyncio

import pytest
from textual.app import App

from tests.waits import wait_for, wait_for_sync, wait_until


def counting(answers: list):
    """A condition that gives ``answers`` one per look (the last one from then on)."""
    looks = []

    def condition():
        looks.append(1)
        return answers[min(len(looks), len(answers)) - 1]
    return condition, looks


def test_it_returns_the_first_value_that_holds():
    condition, looks = counting([None, 0, "", "found", "later"])
    assert wait_for_sync(condition, 3600, "a value", every=0) == "found"
    assert len(looks) == 4


def test_at_the_deadline_it_fails_saying_what_it_waited_for():
    condition, looks = counting([False])
    with pytest.raises(AssertionError, match="timed out after 0 s waiting for the pid file"):
        wait_for_sync(condition, 0, "the pid file")
    assert looks == [1]  # it looked once, at the deadline, before failing


def test_what_may_be_a_function_called_only_at_the_deadline():
    said = []

    def what() -> str:
        said.append(1)
        return "the state, last seen: stalled"
    assert wait_for_sync(lambda: True, 3600, what) is True
    assert said == []
    with pytest.raises(AssertionError, match="last seen: stalled"):
        wait_for_sync(lambda: False, 0, what)
    assert said == [1]


def test_a_condition_that_fails_ends_the_wait_at_once():
    looks = []

    def condition():
        looks.append(1)
        assert len(looks) < 3, "the process it waits on died"
    with pytest.raises(AssertionError, match="the process it waits on died"):
        wait_for_sync(condition, 3600, "a line", every=0)
    assert len(looks) == 3


def test_the_async_poller_lets_the_loop_run_between_looks():
    async def main():
        flag = asyncio.Event()
        asyncio.get_running_loop().call_soon(flag.set)
        assert await wait_for(flag.is_set, 3600, "the flag", every=0) is True
        with pytest.raises(AssertionError, match="waiting for a flag never set"):
            await wait_for(asyncio.Event().is_set, 0, "a flag never set")
    asyncio.run(main())


async def test_the_pilot_poller_lets_the_app_run_until_the_condition_holds():
    class Ticking(App):
        ticks = 0

        def on_mount(self) -> None:
            self.set_interval(0.01, self.tick)

        def tick(self) -> None:
            self.ticks += 1

    app = Ticking()
    async with app.run_test() as pilot:
        assert await wait_until(pilot, lambda: app.ticks >= 3, 3600, "three ticks")
        with pytest.raises(AssertionError, match="waiting for a tick that never comes"):
            await wait_until(pilot, lambda: app.ticks < 0, 0, "a tick that never comes")
