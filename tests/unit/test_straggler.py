"""Stragglers from synthetic samples (agent/rules/straggler.py): a synchronous job simulated step
by step, each rank entering every collective when its own compute ends, the collective
finishing when the last rank enters; the samples carry what the flight recorder would."""

from __future__ import annotations

import math
import random

import pytest

from agent.rules.straggler import HISTORY, MIN_TICKS, SHARE_MIN, WINDOW, Stragglers

WORLD = 4
STEP_S = 0.05  # a fast rank's compute between two collectives
PERIOD = 10.0
COLLECTIVES = 64  # a tick's newest, as agent/supervisor/ranksample.py keeps
T0 = 172_000_000  # the wall-clock tick of a run in 2024, with 10 s ticks


def tick_records(tick: int, slow: dict[int, float], rng: random.Random, noise: float = 0.1,
                 world: int = WORLD) -> list[dict]:
    """One sample record a node (one rank a node) for ``tick``; ``slow``: rank -> how many
    times slower its compute is; every rank's compute varies by up to ``noise``."""
    tick += T0
    start = tick * PERIOD - COLLECTIVES * STEP_S * 4
    entries: dict[int, list] = {r: [] for r in range(world)}
    for seq in range(COLLECTIVES):
        enter = {r: start + STEP_S * slow.get(r, 1.0) * (1 + rng.uniform(0, noise))
                 for r in range(world)}
        for r, t in enter.items():
            entries[r].append(["0", tick * 1000 + seq, int(t * 1e6)])
        start = max(enter.values()) + 0.001  # the collective itself
    return [{"k": "sample", "ts": tick * PERIOD, "tick": tick, "period": PERIOD,
             "ranks": [{"rank": r, "pid": 100 + r, "cpu_s": 1.0, "state": "S",
                        "fr": entries[r]}]} for r in range(world)]


def feed(st: Stragglers, ticks, slow: dict[int, float], rng: random.Random, **kw) -> list:
    events = []
    for tick in ticks:
        for rec in tick_records(tick, slow, rng, **kw):
            events += st.add(rec, kw.get("world", WORLD))
    return events


def test_a_rank_three_times_slower_is_flagged_with_a_slowdown_near_three():
    st = Stragglers()
    events = feed(st, range(WINDOW), {2: 3.0}, random.Random(1))
    assert st.flagged == {2}
    assert 2.7 <= st.slowdown(2) <= 3.3, st.slowdown(2)
    assert all(st.slowdown(r) < 1.1 for r in (0, 1, 3))
    assert [(r, kind) for r, kind, _ in events] == [(2, "straggler")]
    assert "rank 2" in events[0][2] and "slower" in events[0][2]


def test_noise_on_every_rank_flags_nobody():
    st = Stragglers()
    events = feed(st, range(HISTORY), {}, random.Random(2), noise=0.5)
    assert st.flagged == set() and events == []
    assert all(st.slowdown(r) is not None for r in range(WORLD))


def test_one_noisy_tick_does_not_flag():
    st, rng = Stragglers(), random.Random(3)
    feed(st, range(MIN_TICKS), {}, rng)
    assert feed(st, [MIN_TICKS], {1: 10.0}, rng) == []  # one tick with rank 1 far behind
    assert feed(st, range(MIN_TICKS + 1, MIN_TICKS + WINDOW), {}, rng) == []
    assert st.flagged == set()
    assert max(st.history[1]) > SHARE_MIN  # the tick was seen, and outvoted


def test_a_straggler_is_cleared_once_it_keeps_pace():
    st, rng = Stragglers(), random.Random(4)
    feed(st, range(WINDOW), {0: 3.0}, rng)
    assert st.flagged == {0}
    events = feed(st, range(WINDOW, 2 * WINDOW), {}, rng)
    assert [(r, kind) for r, kind, _ in events] == [(0, "straggler cleared")]
    assert st.flagged == set() and st.slowdown(0) < 1.1


def test_nothing_is_decided_before_min_ticks():
    st = Stragglers()
    feed(st, range(MIN_TICKS - 1), {3: 3.0}, random.Random(5))
    assert st.flagged == set() and st.slowdown(3) is None


def test_a_tick_a_rank_is_missing_from_does_not_count():
    st, rng = Stragglers(), random.Random(6)
    for tick in range(WINDOW):
        records = tick_records(tick, {1: 3.0}, rng)
        for rec in records[:-1]:  # rank 3's node never reports: no tick is complete
            assert st.add(rec, WORLD) == []
    assert st.history == {} and st.flagged == set()
    feed(st, range(WINDOW, 2 * WINDOW), {1: 3.0}, rng)  # it comes back
    assert st.flagged == {1}
    assert all(len(h) == WINDOW for h in st.history.values())


def recorder_failed(records: list[dict]) -> None:
    row = records[0]["ranks"][0]
    del row["fr"]
    row["fr_error"] = "the rank did not answer within 3 s"


def rank_outside_the_world(records: list[dict]) -> None:
    records[3]["ranks"][0]["rank"] = 7  # rank 3 missing, a rank 7 no world has


@pytest.mark.parametrize("spoil", [recorder_failed, rank_outside_the_world])
def test_a_tick_without_every_ranks_entry_times_does_not_count(spoil):
    st, rng = Stragglers(), random.Random(7)
    for tick in range(WINDOW):
        records = tick_records(tick, {1: 3.0}, rng)
        spoil(records)
        for rec in records:
            st.add(rec, WORLD)
    assert st.history == {} and st.flagged == set()


def test_samples_of_a_node_replayed_after_the_others_still_count():
    """`attach` replays each node's journal whole, one node after the other."""
    st, rng = Stragglers(), random.Random(8)
    by_tick = [tick_records(t, {2: 3.0}, rng) for t in range(WINDOW)]
    for node in range(WORLD):
        for records in by_tick:
            st.add(records[node], WORLD)
    assert st.flagged == {2}
    assert all(len(h) == WINDOW for h in st.history.values())


HOSTILE_TIMES = [-5, float("nan"), float("inf"), 10 ** 400, 2 ** 70, "12", True, None]


def test_hostile_values_are_left_out_and_break_nothing():
    st, rng = Stragglers(), random.Random(10)
    for tick in range(WINDOW):
        records = tick_records(tick, {}, rng)
        rows = records[0]["ranks"][0]["fr"]  # rank 0's entry times are all garbage
        for i, row in enumerate(rows):
            row[2] = HOSTILE_TIMES[i % len(HOSTILE_TIMES)]
        rows += [[0, 1, 5], ["0", "1", 5], ["0", -1, 5], ["0", 1], "row", None, ["0", 1, 2, 3]]
        for rec in records:
            assert st.add(rec, WORLD) == []
    assert st.history == {}
    for meta in ({"tick": "5", "ranks": []}, {"tick": 5, "ranks": "all"}, {"tick": 5},
                 {"tick": 5, "ranks": [None, 5, {"rank": "0", "fr": []}, {"rank": 0}]},
                 {"tick": float("nan"), "ranks": []}, {"tick": 10 ** 400, "ranks": []}):
        assert st.add(meta, WORLD) == []
    assert st.add({"tick": 1, "ranks": []}, None) == []


def test_a_rank_sending_huge_times_cannot_crash_the_reducer_or_flag_another():
    st, rng = Stragglers(), random.Random(11)
    for tick in range(WINDOW):
        records = tick_records(tick, {}, rng)
        for row in records[0]["ranks"][0]["fr"]:
            row[2] = 2 ** 62  # the largest entry time the rule accepts
        for rec in records:
            st.add(rec, WORLD)
    assert st.flagged <= {0}
    assert all(math.isfinite(s) for h in st.history.values() for s in h)
