"""The run's line budget: memory for kept lines follows one budget, not the rank count.

Streams nobody looks at give up their oldest lines first (down to a floor), shown ones last;
what went is still found again through each stream's floor (scrollback fetches it).
"""

from __future__ import annotations

from console.model.buffers import LINE_OVERHEAD, Kept, LineBudget, line_cost

LINE = "x" * 43  # costs 100 bytes kept


def feed(streams: list[Kept], records: int, lines_per_record: int = 10) -> None:
    for r in range(records):
        for i, kept in enumerate(streams):
            kept.add(float(r), "node%d" % i, r * 1000, [LINE] * lines_per_record)


def test_a_line_costs_its_text_and_the_overhead():
    assert line_cost([LINE, LINE]) == 2 * (43 + LINE_OVERHEAD) == 200


def test_many_streams_stay_within_the_budget_and_unseen_ones_give_way_first():
    budget = LineBudget(limit=600_000, floor=50)
    streams = [Kept(5000, budget) for _ in range(64)]
    shown = streams[7]
    shown.shown_by.add("pane 1")
    feed(streams, 100)  # 64 x 1000 lines = 6.4 MB without a budget
    assert budget.used <= budget.limit
    assert budget.used == sum(k.cost for k in streams)
    assert all(k.cost == line_cost(list(k)) for k in streams)
    unseen = [k for k in streams if k is not shown]
    assert len(shown) == 1000  # the shown stream kept all it had
    assert min(len(k) for k in unseen) >= 50


def test_what_the_budget_dropped_is_named_by_the_floor_for_scrollback():
    budget = LineBudget(limit=20_000, floor=10)
    streams = [Kept(5000, budget) for _ in range(8)]
    feed(streams, 30)
    position, edge = streams[0].floor("node0")
    journal, first = position
    assert edge is not None  # lines were dropped: the view offers to fetch them
    kept_from = [c for c in streams[0].chunks][0]
    assert (journal, first) == (kept_from[2], kept_from[4])


def test_a_budget_smaller_than_the_floors_still_holds():
    budget = LineBudget(limit=20_000, floor=50)
    streams = [Kept(5000, budget) for _ in range(64)]
    feed(streams, 10)
    assert budget.used <= budget.limit


def test_shown_streams_give_way_too_when_they_alone_exceed_the_budget():
    budget = LineBudget(limit=50_000, floor=10)
    streams = [Kept(100_000, budget) for _ in range(2)]
    for k in streams:
        k.shown_by.add("pane")
    feed(streams, 100)
    assert budget.used <= budget.limit
    assert min(len(k) for k in streams) >= 10


def test_without_a_budget_only_the_line_cap_applies():
    kept = Kept(100)
    kept.add(0.0, "node0", 0, [LINE] * 150)
    assert len(kept) == 100 and kept.cost == line_cost([LINE] * 100)


def test_a_streams_cost_follows_its_lines_through_whole_and_partial_drops():
    """Each chunk's cost is counted once, when it comes (console/model/buffers.py ``costs``): what a
    drop frees is still what the dropped lines cost, whole chunks or the front of one."""
    kept = Kept(25)
    for r in range(12):
        kept.add(float(r), "node0", r, ["l%d-%s" % (r, "y" * (r * 7 + i)) for i in range(r + 3)])
        assert kept.cost == line_cost(list(kept)) and len(kept) <= 25
        assert list(kept.costs) == [line_cost(chunk[3]) for chunk in kept.chunks]
    assert kept.chunks[0][4] > 0  # the front of a record went, as well as whole ones
