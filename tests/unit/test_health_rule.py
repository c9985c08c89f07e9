"""The deep check's network rule (agent/rules/health.py): log2 rounds, and who is named."""

from agent.rules import health


def measure(n, rate):
    """Every planned pair of ``n`` nodes measured with ``rate(a, b)``; then the rechecks."""
    pairs = [(a, b, rate(a, b)) for r in health.rounds(n) for a, b in r]
    again = [(a, b, rate(a, b)) for r in health.recheck_rounds(n, pairs) for a, b in r]
    return health.verdict(n, pairs, again)


def test_rounds_grow_with_log2_and_pair_each_node_once_a_round():
    for n, count in ((2, 1), (3, 3), (4, 2), (5, 4), (6, 3), (8, 3), (16, 4), (1000, 10)):
        plan = health.rounds(n)
        assert len(plan) == count
        for r in plan:
            ends = [x for p in r for x in p]
            assert len(ends) == len(set(ends))
    assert health.every_pair(16) == 120


def test_healthy_nodes_are_never_named():
    for n in (3, 4, 6, 8, 16):
        v = measure(n, lambda a, b: 5.0 + 0.5 * ((a * 7 + b) % 3))
        assert v["slow_nodes"] == [] and v["slow_links"] == []


def test_a_slow_node_is_named_and_no_other():
    for n in (3, 4, 6, 8, 16):
        for slow in range(n):
            v = measure(n, lambda a, b: 0.05 if slow in (a, b) else 5.0)
            assert v["slow_nodes"] == [slow] and v["slow_links"] == [], (n, slow)


def test_a_slow_link_is_told_from_a_slow_node():
    v = measure(8, lambda a, b: 0.05 if (a, b) == (2, 3) else 5.0)
    assert v["slow_nodes"] == []
    assert [(a, b) for a, b, _ in v["slow_links"]] == [(2, 3)]


def test_a_node_that_fails_to_measure_counts_as_slow():
    v = measure(6, lambda a, b: None if 4 in (a, b) else 5.0)
    assert v["slow_nodes"] == [4]


def test_the_console_takes_only_planned_pairs_with_real_rates():
    import pytest

    from console.run.deep import _pairs

    planned = {p for r in health.rounds(4) for p in r}
    assert _pairs([[0, 1, 2.5], [2, 3, 0]], 4, planned) == [(0, 1, 2.5), (2, 3, 0.0)]
    for bad in ([[0, 3, 1.0]], [[0, 1, 1.0], [0, 1, 1.0]], [[0, 1, float("nan")]],
                [[0, 1, True]], [[0, 1, -1]], [[0, 1, "9"]], [[0, 1]], {"0": 1}):
        with pytest.raises(ValueError):
            _pairs(bad, 4, planned)
