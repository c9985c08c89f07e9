"""EntryWindow: what a log view holds, and the floors that say where scrolling back starts.

A floor per node is the position from which the window holds every line of its source from
that node; whatever the window drops or refuses must move the floor above it, or a fetch from
the floor would skip lines (or show some twice).
"""

from __future__ import annotations

from console.lines.lines import Entry
from console.lines.window import EntryWindow


def line(node: str, journal: int | None, index: int, ts: float = 0.0) -> Entry:
    return Entry(ts, node, 0, "%s %s.%d" % (node, journal, index), journal, index)


def texts(window: EntryWindow) -> list[str]:
    return [e.text for e in window]


def test_trimming_drops_the_oldest_and_moves_their_nodes_floors_past_them():
    window = EntryWindow()
    entries = [line("a", 10, 0), line("b", 7, 0), line("a", 10, 1), line("b", 9, 0),
               line("a", 20, 0)]
    window.replace(entries, {"a": (10, 0), "b": (7, 0), "c": (3, 0)}, limit=10)
    version = window.version

    assert window.trim(2) == 3
    assert texts(window) == ["b 9.0", "a 20.0"]
    # a's newest dropped line was (10, 1), b's (7, 0): the floors sit just after them
    assert window.floors == {"a": (10, 2), "b": (7, 1), "c": (3, 0)}
    assert window.version != version  # a Scrollback built on the old floors is stale

    version = window.version
    assert window.trim(2) == 0  # within the limit: nothing moves
    assert window.version == version and len(window) == 2


def test_a_floor_unknown_for_good_stays_unknown_and_lines_without_positions_make_one():
    window = EntryWindow()
    window.replace([line("old", 5, 0), line("x", None, 0), line("x", None, 1), line("a", 1, 0)],
                   {"old": None}, limit=10)
    window.trim(1)
    # "old" gave no positions before: a position now would claim lines it never had
    assert window.floors["old"] is None
    assert window.floors["x"] is None  # its agent gives no positions
    assert texts(window) == ["a 1.0"]


def test_replace_keeps_the_newest_up_to_the_limit():
    window = EntryWindow()
    window.replace([line("a", 1, k) for k in range(5)], {"a": (1, 0)}, limit=3)
    assert texts(window) == ["a 1.2", "a 1.3", "a 1.4"]
    assert window.floors == {"a": (1, 2)}


def test_merges_keep_order_new_lines_behind_older_ones_in_front():
    window = EntryWindow()
    window.replace([line("a", 5, 0), line("a", 5, 1)], {"a": (4, 0)}, limit=100)
    window.add([line("a", 6, 0), line("a", 6, 1)], limit=100)
    window.prepend([line("a", 4, 0), line("a", 4, 1)], limit=100)  # a refill's backlog
    assert texts(window) == ["a 4.0", "a 4.1", "a 5.0", "a 5.1", "a 6.0", "a 6.1"]
    assert [e.position for e in window] == sorted(e.position for e in window)

    dropped = window.add([line("a", 7, 0)], limit=6)  # full: the oldest goes, not the newest
    assert dropped == 1 and texts(window)[0] == "a 4.1" and texts(window)[-1] == "a 7.0"
    assert window.floors["a"] == (4, 1)


def test_older_lines_that_fit_go_in_front_and_take_the_fetchers_floors():
    window = EntryWindow()
    window.replace([line("a", 10, 0), line("b", 12, 0)], {"a": (10, 0), "b": (12, 0)},
                   limit=10)
    version = window.version
    older = [line("b", 3, 0), line("a", 4, 0), line("a", 4, 1)]
    taken = window.prepend_older(older, {"a": (4, 0), "b": (3, 0)}, limit=10)
    assert taken == older
    assert texts(window) == ["b 3.0", "a 4.0", "a 4.1", "a 10.0", "b 12.0"]
    assert window.floors == {"a": (4, 0), "b": (3, 0)}
    assert window.version == version  # the fetcher's floors: it may carry on from them


def test_older_lines_beyond_the_limit_take_only_the_newest_and_floors_stop_above_the_rest():
    window = EntryWindow()
    window.replace([line("a", 10, 0), line("b", 12, 0)], {"a": (10, 0), "b": (12, 0)},
                   limit=4)
    version = window.version
    older = [line("a", 2, 0), line("b", 3, 0), line("b", 3, 1), line("a", 4, 0)]
    taken = window.prepend_older(older, {"a": (2, 0), "b": (3, 0)}, limit=4)
    assert taken == older[2:]
    assert texts(window) == ["b 3.1", "a 4.0", "a 10.0", "b 12.0"]
    # what was refused is not held: the next fetch must start above it, not at the fetcher's
    assert window.floors == {"a": (2, 1), "b": (3, 1)}
    assert window.version != version

    full = window.prepend_older([line("a", 1, 0)], {"a": (1, 0)}, limit=4)
    assert full == [] and window.floors["a"] == (1, 1) and len(window) == 4
