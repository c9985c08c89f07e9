"""The app's collector settings (console/tui/lru.py): what survives a full collection is
frozen out of the next ones, and handed back every SWEEP_S so a cycle that died frozen is
freed (issue 30: full collections grew with the run's age at 512 ranks)."""

from __future__ import annotations

import gc

from console.tui import lru


class Cycle:
    def __init__(self):
        self.me = self


def test_survivors_of_a_full_collection_are_frozen_and_handed_back_at_the_sweep():
    before = gc.get_threshold()
    lru.tune_gc()
    try:
        survivor = [Cycle() for _ in range(100)]
        gc.collect()  # a full collection: its survivors frozen
        assert gc.get_freeze_count() >= len(survivor)
        assert not any(c in gc.get_objects(generation=2) for c in survivor[:3])
        lru._sweep_at[0] = 0.0  # the sweep is due: the next full collection hands them back
        gc.collect()
        assert gc.get_freeze_count() == 0
        del survivor  # died frozen? no: handed back, so a full collection frees the cycles
        gc.collect()  # (and freezes again what survives it)
        assert not any(isinstance(o, Cycle) for o in gc.get_objects())
    finally:
        lru.untune_gc(before)
    assert lru.freeze_after_full not in gc.callbacks and gc.get_freeze_count() == 0
