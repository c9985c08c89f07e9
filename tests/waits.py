"""The tests' one poller: wait until a condition holds, or fail at a deadline saying what.

A test never sleeps a fixed time and then asserts: on a loaded host the fixed time is too
short (the test fails for nothing) or, before a negative assertion, the event was never
processed and the test passes without testing anything. It waits on the condition it then
asserts instead, with a generous deadline (a deadline is a failure, never a measurement).
For "X did not happen", it first waits for a positive sign that the thing that could have
made X was processed (the message was handled, a counter moved, a frame was drawn).

Three ways to pause between looks, one deadline:

- :func:`wait_for` in async tests (``await asyncio.sleep`` between looks);
- :func:`wait_until` in Textual Pilot tests (``pilot.pause``, so the app runs and refreshes);
- :func:`wait_for_sync` in plain tests (``time.sleep``).

Each returns the condition's last value (a truthy one), so a test can wait for a thing and
use it: ``pid = wait_for_sync(read_pid, 30, "the pid file")``. ``what`` names what is awaited
in the failure; it may be a function, called only at the deadline, to add what was seen last
(``lambda: "every rank stepping; status %s" % ctl.state.status()``). A condition may raise
AssertionError itself to fail at once (the process it waits on died).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Union

What = Union[str, Callable[[], str]]


class _Deadline:
    """Looks at ``condition`` until it holds; raises AssertionError once ``timeout`` passed."""

    def __init__(self, condition: Callable[[], Any], timeout: float, what: What):
        self.condition = condition
        self.timeout = timeout
        self.what = what
        self.at = time.monotonic() + timeout
        self.value: Any = None

    def met(self) -> bool:
        """True once the condition holds; the last look is at or after the deadline."""
        self.value = self.condition()
        if self.value:
            return True
        if time.monotonic() >= self.at:
            what = self.what() if callable(self.what) else self.what
            raise AssertionError("timed out after %g s waiting for %s" % (
                self.timeout, what or getattr(self.condition, "__name__", "a condition")))
        return False


async def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: What = "",
                   every: float = 0.1) -> Any:
    """In an async test: ``condition()`` (a plain function) until it holds."""
    deadline = _Deadline(condition, timeout, what)
    while not deadline.met():
        await asyncio.sleep(every)
    return deadline.value


async def wait_until(pilot, condition: Callable[[], Any], timeout: float = 30.0, what: What = "",
                     every: float = 0.05) -> Any:
    """In a Pilot test: let the app run in small pauses until ``condition()`` holds."""
    deadline = _Deadline(condition, timeout, what)
    while not deadline.met():
        await pilot.pause(every)
    return deadline.value


def wait_for_sync(condition: Callable[[], Any], timeout: float = 30.0, what: What = "",
                  every: float = 0.05) -> Any:
    """In a plain test: ``condition()`` until it holds, sleeping between looks."""
    deadline = _Deadline(condition, timeout, what)
    while not deadline.met():
        time.sleep(every)
    return deadline.value
