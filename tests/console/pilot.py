"""Waiting in Pilot tests: let the app run until a condition holds, or fail saying what."""

from __future__ import annotations

import time


async def until(pilot, condition, timeout: float = 30.0, what: str = "",
                every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(every)
    raise AssertionError("timed out waiting for %s" % (what or condition))
