"""Kept lines stay out of the garbage collector's way (issue 12).

At 512 ranks the kept lines are ~170k chunks; when each held a list, every collection walked
them all (a full one took 270 ms of the event loop, bench/tui.py). A chunk of strings is
untracked after the collector's first looks.
"""

from __future__ import annotations

import gc

from console.model.buffers import Kept, LineBudget


def test_kept_chunks_are_not_tracked_once_collected():
    kept = Kept(cap=1000, budget=LineBudget())
    for i in range(50):
        kept.add(float(i), "node1", 7, ["step %d loss=1.0" % i, "more %d" % i])
    kept.drop_front(3)  # a chunk cut at the front is a chunk like the others
    gc.collect()
    gc.collect()  # a chunk's lines are untracked in one pass, the chunk around them the next
    tracked = [c for c in kept.chunks if gc.is_tracked(c) or gc.is_tracked(c[3])]
    assert tracked == []
    assert list(kept)[:2] == ["more 1", "step 2 loss=1.0"]
    assert kept[-1] == "more 49"
