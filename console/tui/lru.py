"""Caches that leave no garbage for the cycle collector, and the collector tuned to match.

Textual's ``LRUCache`` links its entries in a ring of lists; ``clear()`` drops the ring whole,
so every entry and the rows it held become cyclic garbage that only a collection frees. The
log view clears its cache on every refill (each rank switch), 1,024 rows at a time, and with
``Strip.divide`` below that garbage was what made the console's full collections run 70 ms
at 512 ranks (bench/tui.py), in the middle of a key press. ``tune_gc`` sets the collector
for what is left (docs/BENCHMARKS.md, "The view").
"""

from __future__ import annotations

import gc
import os
import time
from collections import OrderedDict

from textual.strip import Strip

# The collector's thresholds while the app runs (tune_gc); RANKDECK_GC="a,b,c" overrides them.
GC_THRESHOLDS = tuple(int(x) for x in os.environ.get("RANKDECK_GC", "10000,10,10").split(","))
# How often the objects frozen after full collections (freeze_after_full) are handed back to
# the collector, so that a cycle that died among them is freed: one long collection then.
SWEEP_S = 900.0


class LRU:
    """At most ``maxsize`` entries, the least recently used dropped first."""

    __slots__ = ("maxsize", "_data")

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        value = self._data.get(key, default)
        if value is not default:
            self._data.move_to_end(key)
        return value

    def __setitem__(self, key, value) -> None:
        data = self._data
        data[key] = value
        data.move_to_end(key)
        if len(data) > self.maxsize:
            data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()


_divide = Strip.divide


def _divide_without_cycle(self: Strip, cuts) -> list[Strip]:
    """``Strip.divide``, less the cycle it makes when the one piece is the strip itself: it
    caches ``[self]`` inside itself, so every strip the compositor divides at its own length
    (each line of a widget that spans its region) outlives its last reference until a
    collection. Without the cache entry such a strip is freed when the next frame replaces
    it; dividing it again costs a list. The cache is private to Textual (internals.py)."""
    strips = _divide(self, cuts)
    if len(strips) == 1 and strips[0] is self:
        self._divide_cache.clear()
    return strips


def strips_without_cycles(on: bool = True) -> None:
    """Put the cycle-free ``Strip.divide`` in place (``on``) or Textual's own back. Process
    wide, like the collector's settings it goes with (tune_gc)."""
    Strip.divide = _divide_without_cycle if on else _divide


def tune_gc() -> None:
    """Fewer, shorter garbage collections while thousands of lines a second stream in.

    Textual leaves each rendered Strip in a reference cycle (it caches itself when divided),
    and with CPython's default young generation (700 objects) those strips outlived it and
    reached the oldest one: in bench/tui.py full collections then ran 1.5 times a second for
    up to 0.3 s each. With 10,000 (``RANKDECK_GC`` overrides) most die young, and what exists
    once the screen is up (modules, widgets) is frozen out of the collector. The strips' cycle
    itself is cut too (strips_without_cycles): with it the full collections that were
    left still took 70 ms at 512 ranks. Process-wide, so only ``run_app`` asks for it, and
    puts the defaults back afterwards.
    """
    gc.freeze()
    gc.set_threshold(GC_THRESHOLDS[0], GC_THRESHOLDS[1], GC_THRESHOLDS[2])
    strips_without_cycles()
    if freeze_after_full not in gc.callbacks:
        _sweep_at[0] = time.monotonic() + SWEEP_S
        gc.callbacks.append(freeze_after_full)


def untune_gc(thresholds: tuple) -> None:
    """What :func:`tune_gc` changed put back (``thresholds``: gc.get_threshold() before)."""
    if freeze_after_full in gc.callbacks:
        gc.callbacks.remove(freeze_after_full)
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    strips_without_cycles(False)


_sweep_at = [0.0]


def freeze_after_full(phase: str, info: dict) -> None:
    """A gc callback: what survives a full collection is frozen out of the next ones.

    The run's data (512 ranks' states, kept lines, loss series, the widgets) is made after
    tune_gc's first freeze and lives for good; every full collection walked all of it, so
    they grew with the run's age: none in a run's first 30 s, then one every 30-40 s of 57-73
    ms at 512 ranks, inside a key press now and then (bench/tui.py --seconds 90: key p99
    on-CPU 55 ms where 30-second runs read 23-35). Frozen, a full collection walks only
    what was made since the one before. A cycle that dies among frozen objects is freed
    only when they are handed back, every SWEEP_S (that collection is a long one, once).
    """
    if phase != "stop" or info.get("generation") != 2:
        return
    if time.monotonic() >= _sweep_at[0]:
        gc.unfreeze()  # the next full collection walks everything once
        _sweep_at[0] = time.monotonic() + SWEEP_S
    else:
        gc.freeze()
