"""The loss chart's canvas takes any finite point and leaves out the rest: a diverged run's
inf/NaN loss, or losses as far apart as -1e308 and 1e308, used to end the view in int(nan)."""

from __future__ import annotations

import math

import pytest

from console.tui.braille import bounds, plot


def drawn(rows) -> int:
    return sum(1 for row in rows for ch, _who in row if ch != " ")


@pytest.mark.parametrize("points", [
    [(1, 2.5), (2, math.inf)],
    [(1, 2.5), (2, math.nan), (3, -math.inf)],
    [(0, 1e308), (1, -1e308)],
    [(0, 1.7e308), (1, 1.7e308), (2, -1.7e308)],
    [(0, 5e-324), (1, -5e-324)],
    [(2 ** 62 - 1, 1.0), (0, 2.0)],
])
def test_any_points_plot_without_an_error(points):
    box = bounds([points])
    assert box is not None and all(math.isfinite(v) for v in box)
    rows = plot([points], 20, 5, box)
    assert len(rows) == 5 and all(len(r) == 20 for r in rows)
    assert drawn(rows) > 0  # the finite points are drawn


def test_only_non_finite_points_leave_the_chart_empty():
    assert bounds([[(1, math.nan), (2, math.inf)]]) is None


def test_far_apart_points_land_at_the_top_and_bottom():
    rows = plot([[(0, 1e308), (1, -1e308)]], 10, 4, bounds([[(0, 1e308), (1, -1e308)]]))
    assert rows[0][0][0] != " " and rows[-1][-1][0] != " "
