"""Silent ranks' CPU from synthetic samples (agent/rules/rankcpu.py): whose CPU advanced, and how
long the run has gone with no rank's CPU advancing."""

from __future__ import annotations

import math

from agent.rules.rankcpu import CPU_MIN_SHARE, RankCpu

PERIOD = 10.0
T0 = 1_720_000_000.0


def sample(tick: int, cpu: dict[int, float], pid: dict[int, int] | None = None,
           after: dict[int, float] | None = None, fr: list | None = None) -> dict:
    """``fr``: the collectives each rank lists (default: one, the run is past its start)."""
    ranks = []
    for rank, cpu_s in cpu.items():
        row = {"rank": rank, "pid": (pid or {}).get(rank, 100 + rank), "cpu_s": cpu_s,
               "state": "R", "fr": [["0", 1, 5]] if fr is None else fr}
        if after and rank in after:
            row["cpu_after_s"] = after[rank]
        ranks.append(row)
    return {"k": "sample", "ts": T0 + tick * PERIOD, "tick": tick, "period": PERIOD,
            "ranks": ranks}


def test_a_rank_whose_cpu_advances_is_named_and_an_idle_one_is_not():
    rc = RankCpu()
    assert rc.add(sample(0, {0: 1.0, 1: 1.0})) == []  # nothing to compare with yet
    busy = 1.0 + 2 * CPU_MIN_SHARE * PERIOD
    idle = 1.0 + CPU_MIN_SHARE * PERIOD / 2
    assert rc.add(sample(1, {0: busy, 1: idle})) == [0]
    assert rc.cpu_s(0) == busy and rc.cpu_s(1) == idle and rc.cpu_s(5) is None
    rc.add(sample(3, {0: busy, 1: idle}))
    assert rc.sampled_idle_s([0, 1]) == 2 * PERIOD


def test_the_run_is_idle_from_its_last_rank_advancing_to_its_newest_sample():
    rc = RankCpu()
    assert rc.sampled_idle_s([0, 1]) is None  # no rank ever advanced: nothing to say
    rc.add(sample(0, {0: 1.0, 1: 1.0}))
    rc.add(sample(1, {0: 5.0, 1: 1.0}))
    rc.add(sample(2, {0: 5.0, 1: 5.0}))
    assert rc.sampled_idle_s([0, 1]) == 0  # between samples the clock says nothing
    rc.add(sample(5, {0: 5.0, 1: 5.0}))
    assert rc.sampled_idle_s([0, 1]) == 3 * PERIOD
    assert rc.sampled_idle_s([0]) == 4 * PERIOD


def test_a_run_not_past_its_start_is_not_idle_but_a_rank_that_cannot_tell_counts():
    """Ranks idle in the rendezvous before their first collective are starting, not stuck;
    a rank without the flight-recorder hook has only its CPU to show."""
    rc = RankCpu()
    for tick, cpu in enumerate((1.0, 5.0, 5.0, 5.0)):
        rc.add(sample(tick, {0: cpu}, fr=[]))
    assert rc.sampled_idle_s([0]) is None
    row = {"rank": 0, "pid": 100, "cpu_s": 5.0, "state": "S",
           "fr_error": "no flight-recorder hook in this rank"}
    rc.add(dict(sample(4, {}), ranks=[row]))
    assert rc.sampled_idle_s([0]) == 3 * PERIOD


def test_the_flight_recorder_dump_is_not_counted_as_the_rank_working():
    rc = RankCpu()
    rc.add(sample(0, {0: 1.0}, after={0: 3.0}))  # the dump took 2 s of CPU
    assert rc.add(sample(1, {0: 3.0}, after={0: 3.0})) == []
    assert rc.add(sample(2, {0: 6.0}, after={0: 6.0})) == [0]


def test_a_new_worker_pid_starts_over():
    rc = RankCpu()
    rc.add(sample(0, {0: 50.0}))
    assert rc.add(sample(1, {0: 60.0}, pid={0: 999})) == []  # restarted: another process
    assert rc.add(sample(2, {0: 70.0}, pid={0: 999})) == [0]


HOSTILE = [float("nan"), float("inf"), -1.0, 10 ** 400, "5", True, None, [1]]


def test_hostile_values_never_advance_a_rank_nor_end_up_in_status():
    rc = RankCpu()
    rc.add(sample(0, {0: 1.0, 1: 1.0}))
    for i, bad in enumerate(HOSTILE):
        assert rc.add(sample(1 + i, {0: bad, 1: 1.0})) == [], bad
        assert rc.add(sample(1 + i, {0: 1.0, 1: 1.0}, after={1: bad})) == [], bad
        assert rc.add(dict(sample(1 + i, {0: 90.0 + i}), ts=bad)) == [], bad
        assert rc.add(dict(sample(1 + i, {0: 90.0 + i}), period=bad)) == [], bad
        for key in ("rank", "pid"):
            row = {"rank": 0, "pid": 100, "cpu_s": 99.0 + i, key: bad}
            assert rc.add(dict(sample(1 + i, {}), ranks=[row])) == [], (key, bad)
    for meta in ({}, {"ts": T0, "period": PERIOD, "ranks": "all"},
                 {"ts": T0, "period": PERIOD, "ranks": [None, 5, "r"]},
                 dict(sample(20, {0: 500.0}), period=0), dict(sample(20, {0: 500.0}), period=-10)):
        assert rc.add(meta) == []
    assert rc.advanced_at == {}
    assert all(isinstance(rc.cpu_s(r), float) and math.isfinite(rc.cpu_s(r)) for r in (0, 1))


def test_a_sample_after_a_late_dump_is_no_evidence():
    """``rebase``: the rank answered its dump after the supervisor stopped waiting, so the
    CPU since the last sample may be the dump's (agent/supervisor/ranksample.py): the counter moves on,
    the rank is not named."""
    rc = RankCpu()
    rc.add(sample(0, {0: 1.0}))
    late = sample(1, {0: 1.5})
    late["ranks"][0]["rebase"] = True
    assert rc.add(late) == [] and rc.cpu_s(0) == 1.5
    assert rc.add(sample(2, {0: 1.5})) == []  # counted from the new base
    assert rc.add(sample(3, {0: 4.0})) == [0]
