"""The view leaves no garbage for the cycle collector (keys waited behind collections:
docs/BENCHMARKS.md, "The view").

At 512 ranks (bench/tui.py) the console's full collections took ~70 ms, often in the middle of
a key press, and what they freed was the view's own leftovers: strips Textual caches inside
themselves when divided, and the rows of the log view's cache, dropped as a ring of linked
lists at every refill. The view now frees both when it lets go of them.
"""

from __future__ import annotations

import gc
import time

import pytest
from rich.segment import Segment
from textual.cache import LRUCache
from textual.strip import Strip

from console.tui import lru
from console.tui.app import RankdeckApp
from tests.waits import wait_until as until
from tests.console.scripted import controller, host_names, standard_script


def unreachable_after(make) -> int:
    """Objects only the cycle collector can free once ``make()``'s result is dropped."""
    gc.collect()
    gc.disable()
    try:
        make()
        return gc.collect()
    finally:
        gc.enable()


def test_a_cleared_lru_is_freed_at_once_unlike_textuals():
    def fill_and_clear(cache):
        for i in range(100):
            cache[i] = [("row", i)]
        assert cache.get(99) == [("row", 99)] and cache.get(5) is None
        cache.clear()
    assert unreachable_after(lambda: fill_and_clear(lru.LRU(50))) == 0
    assert unreachable_after(lambda: fill_and_clear(LRUCache(50))) > 0  # why LRU exists


def test_a_strip_divided_at_its_own_length_is_freed_at_once():
    def divide():
        strip = Strip([Segment("x" * 10)], 10)
        assert strip.divide([10]) == [strip]
    try:
        lru.strips_without_cycles(False)
        assert unreachable_after(divide) > 0  # Textual's own: the strip caches itself
        lru.strips_without_cycles()
        assert unreachable_after(divide) == 0
        strip = Strip([Segment("x" * 10)], 10)  # a real cut is still cached
        assert strip.divide([4, 10]) is strip.divide([4, 10])
    finally:
        lru.strips_without_cycles(False)


@pytest.fixture
def restore_gc():
    thresholds = gc.get_threshold()
    yield
    gc.set_debug(0)
    gc.garbage.clear()
    lru.untune_gc(thresholds)


async def test_switching_ranks_while_lines_stream_leaves_no_strip_to_collect(
        tmp_path, monkeypatch, restore_gc):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    hosts = host_names(4)
    script = standard_script(hosts, 2, t0=time.time())
    ctl, launch = controller(str(tmp_path), script.transport(), hosts=4, slots=2)
    app = RankdeckApp(ctl, launch, gc_tuning=True)  # as run_app starts it
    async with app.run_test(size=(160, 48)) as pilot:
        await until(pilot, lambda: not app.launching, what="launch")
        await until(pilot, lambda: app.logs.panes[0].view.lines_text(), what="lines")
        await pilot.pause(0.3)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what collections find is kept to look at
        for _ in range(6):
            await pilot.press("right_square_bracket")
            await pilot.pause(0.15)
        gc.collect()
        strips = [o for o in gc.garbage if isinstance(o, Strip)]
        gc.set_debug(0)
        gc.garbage.clear()
    assert strips == []
