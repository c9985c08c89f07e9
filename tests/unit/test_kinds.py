"""What a host's number must be (agent/rules/kinds.py), and the readers that use it: an int
too large for a float (JSON may write one out in 400 digits) is no figure. Before, the
preflight's checker and goodput raised OverflowError on it (math.isfinite of such an int)."""

from __future__ import annotations

from agent.rules import kinds
from agent.rules.goodput import Goodput
from console.run import facts

HUGE = 10 ** 400


def test_the_predicates():
    assert [kinds.integer(v) for v in (3, -3, True, 3.0, "3", None)] == \
        [True, True, False, False, False, False]
    assert [kinds.whole(v) for v in (0, 5, -1, False, 2.0)] == [True, True, False, False, False]
    assert kinds.whole(10, 10) and not kinds.whole(11, 10)
    assert [kinds.finite(v) for v in (1, 1.5, -2, float("nan"), float("inf"), HUGE, -HUGE,
                                      10 ** 300, True, "1")] == \
        [True, True, True, False, False, False, False, True, False, False]


def test_a_preflight_answer_with_an_int_too_large_for_a_float_drops_that_field():
    kept, bad = facts.checked({"time": HUGE, "disk_free": HUGE, "hostname": "n1"})
    assert "time" not in kept and "disk_free" not in kept and kept["hostname"] == "n1"
    assert set(bad) >= {"time", "disk_free"}, bad


def test_goodput_leaves_out_records_whose_time_is_too_large_for_a_float():
    g = Goodput()
    g.add("node0", {"k": "file", "f": 0, "rank": 0})
    for step, ts in ((1, 100.0), (2, HUGE), (3, 102.0)):
        g.add("node0", {"k": "metric", "step": step, "f": 0, "ts": ts})
    g.add(None, {"k": "event", "what": "stalled", "ts": HUGE})
    report = g.report()
    assert report["ranks"] == 1, report


def test_a_deep_checks_figures_too_large_for_a_float_are_no_figures():
    from console.model import health
    from console.records import goodput as goodput_record
    from console.run import deep

    assert deep._gpu_figures([{"index": 0, "tflops": HUGE, "copy_gbps": 10}]) == \
        [{"index": 0, "tflops": None, "copy_gbps": 10.0}]
    assert health._figure(HUGE) is None and health._figure(2) == 2.0
    assert not goodput_record._finite(HUGE) and goodput_record._finite(3.5)
