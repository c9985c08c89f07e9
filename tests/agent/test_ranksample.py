"""The supervisor's periodic sample (agent/supervisor/ranksample.py) without torch: this process and a
real worker child (RANK in its env, the real flight-recorder hook on its path) are sampled
from /proc; the hook answers that torch is not imported, which the sample records."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agent.torchrun import hooks
from agent.supervisor import ranksample
from agent.host.journal import JournalWriter, parse
from tests.waits import wait_for_sync

WORKER = "import time\nwhile True:\n    sum(range(10000))\n    time.sleep(0.001)\n"


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_cpu_seconds_of_a_live_process_grow_and_a_gone_one_is_none():
    before = ranksample.cpu_seconds(os.getpid())
    burn(0.3)
    after = ranksample.cpu_seconds(os.getpid())
    assert isinstance(before, float) and after >= before + 0.2
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert ranksample.cpu_seconds(gone.pid) is None


@pytest.mark.parametrize("env,period", [({}, 10.0), ({"RANKDECK_SAMPLE_S": "2"}, 2.0),
                                        ({"RANKDECK_SAMPLE_S": "0"}, 0.0),
                                        ({"RANKDECK_SAMPLE_S": "-5"}, 0.0),
                                        ({"RANKDECK_SAMPLE_S": "soon"}, 0.0),
                                        ({"RANKDECK_SAMPLE_S": "nan"}, 0.0),
                                        ({"RANKDECK_SAMPLE_S": "inf"}, 0.0),
                                        ({"RANKDECK_SAMPLE_S": "0.01"}, 1.0),
                                        ({"RANKDECK_SAMPLE_S": "1e9"}, 3600.0)])
def test_the_period_comes_from_the_run_env(env, period):
    assert ranksample.period_of(env) == period


def test_entry_times_keep_the_newest_collectives_only():
    entries = [{"pg_id": 0, "collective_seq_id": s, "time_created_ns": 1_000_000 * s + 999,
                "is_p2p": False} for s in range(1, 101)]
    entries[-2]["is_p2p"] = True  # a send: not a collective every rank enters
    entries[-3]["time_created_ns"] = None
    entries[-4]["collective_seq_id"] = "97"
    rows = ranksample.entry_times({"entries": entries})
    assert len(rows) == ranksample.KEEP
    assert rows[-1] == ["0", 100, 100_000]  # us, the pg as text
    assert [r[1] for r in rows[-3:]] == [95, 96, 100]
    assert ranksample.entry_times({}) == [] and ranksample.entry_times({"entries": None}) == []


@pytest.fixture
def node(tmp_path):
    """A node folder with a journal, and a started worker child; yields (folder, journal, proc)."""
    env = dict(os.environ, RANK="3", LOCAL_RANK="0", WORLD_SIZE="4")
    fr_dir = hooks.install(str(tmp_path), env)
    journal = JournalWriter(str(tmp_path / "journal"))
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env)
    try:
        wait_for_sync(lambda: os.path.exists(os.path.join(fr_dir, "%d.req" % proc.pid)), 30,
                      "the worker's hook to listen")
        yield tmp_path, journal, proc
    finally:
        proc.kill()
        proc.wait()
        journal.close()


def records(folder) -> list[dict]:
    with open(folder / "journal", "rb") as f:
        return [meta for meta, _, _ in parse(f.read())[0]]


def sample_once(sampler, clock_now: list[float], at: float) -> None:
    """One tick at ``at``, then ticks until the sample it began is written."""
    clock_now[0] = at
    sampler.tick()

    def written() -> bool:
        if sampler._pending is not None:
            sampler.tick()
        return sampler._pending is None
    wait_for_sync(written, ranksample.ANSWER_WAIT + 10, "the sample written", every=0.02)


def sampled_until(sampler, clock_now: list[float], folder, done, what: str) -> None:
    """A sample every 10 s of the sampler's clock until ``done(records)``."""
    def again():
        clock_now[0] += 10
        sample_once(sampler, clock_now, clock_now[0])
        return done(records(folder))
    wait_for_sync(again, 30, what, every=0)


def test_a_worker_is_sampled_once_a_tick_with_its_cpu_state_and_the_hooks_answer(node):
    folder, journal, proc = node
    now = [1_720_000_000.0]
    sampler = ranksample.RankSampler(journal, str(folder), 10.0, clock=lambda: now[0])
    sample_once(sampler, now, 1_720_000_001.0)
    sample_once(sampler, now, 1_720_000_009.0)  # the same tick: no second sample
    (first,) = records(folder)
    wait_for_sync(lambda: ranksample.cpu_seconds(proc.pid) > first["ranks"][0]["cpu_after_s"],
                  30, "the worker to get the CPU")
    sample_once(sampler, now, 1_720_000_010.0)
    first, second = records(folder)
    assert (first["k"], first["tick"], first["period"]) == ("sample", 172_000_000, 10.0)
    assert second["tick"] == 172_000_001 and second["ts"] == 1_720_000_010.0
    rank = first["ranks"][0]
    assert len(first["ranks"]) == 1 and (rank["rank"], rank["pid"]) == (3, proc.pid)
    assert rank["state"] in ("R", "S") and "fr" not in rank
    assert "torch is not imported" in rank["fr_error"]
    assert 0 < rank["cpu_s"] <= rank["cpu_after_s"] <= second["ranks"][0]["cpu_s"]
    assert second["ranks"][0]["cpu_s"] > rank["cpu_s"]  # the worker kept busy


def test_a_worker_without_the_hook_is_sampled_with_the_reason(tmp_path):
    env = dict(os.environ, RANK="1", LOCAL_RANK="1")
    journal = JournalWriter(str(tmp_path / "journal"))
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env)
    try:
        now = [1_720_000_000.0]
        sampler = ranksample.RankSampler(journal, str(tmp_path), 10.0, clock=lambda: now[0])
        sampled_until(sampler, now, tmp_path, bool, "the child's environ readable as a worker's")
        rank = records(tmp_path)[0]["ranks"][0]
        assert rank["rank"] == 1 and "no flight-recorder hook" in rank["fr_error"]
        assert "cpu_after_s" not in rank and "fr" not in rank
    finally:
        proc.kill()
        proc.wait()
        journal.close()


def test_no_sample_when_switched_off_or_without_workers(tmp_path):
    journal = JournalWriter(str(tmp_path / "journal"))
    try:
        now = [1_720_000_000.0]
        for period in (0.0, 10.0):  # off; on, but this process has no worker child
            sampler = ranksample.RankSampler(journal, str(tmp_path), period, clock=lambda: now[0])
            sample_once(sampler, now, now[0] + 10)
        assert records(tmp_path) == []
    finally:
        journal.close()


def test_a_dump_answered_too_late_marks_the_next_samples(node, monkeypatch):
    """A rank that cannot answer within ANSWER_WAIT (a loaded host) answers later, and that
    CPU lands in a later sample: those samples say ``rebase`` so the console does not take the
    dump for the rank working (agent/rules/rankcpu.py). The late answer is made by holding the
    real answer back from the sampler for one sample (a load that delays it is not made on
    demand)."""
    folder, journal, proc = node
    monkeypatch.setattr(ranksample, "ANSWER_WAIT", 0.3)
    now = [1_720_000_000.0]
    sampler = ranksample.RankSampler(journal, str(folder), 10.0, clock=lambda: now[0])
    sample_once(sampler, now, 1_720_000_010.0)  # answered in time
    real_answer = ranksample.fr_dump.answer
    monkeypatch.setattr(ranksample.fr_dump, "answer", lambda *a: None)
    sample_once(sampler, now, 1_720_000_020.0)  # not answered within the wait
    monkeypatch.setattr(ranksample.fr_dump, "answer", real_answer)
    for at in (30, 40, 50):
        sample_once(sampler, now, 1_720_000_000.0 + at)
    ranks = [r["ranks"][0] for r in records(folder)]
    assert "did not answer" not in ranks[0].get("fr_error", "")
    assert "did not answer" in ranks[1]["fr_error"]
    assert [r.get("rebase") for r in ranks] == [None, None, True, True, None]


def test_the_workers_found_are_sampled_again_until_one_goes(tmp_path, monkeypatch):
    """Finding the workers reads every process on the host; the ones found are reused while
    they all live and are as many as LOCAL_WORLD_SIZE says, and searched for again when one
    went (a restart's new workers) or one is missing (workers still starting)."""
    searches = []
    real = ranksample.workers
    monkeypatch.setattr(ranksample, "workers",
                        lambda pid: searches.append(pid) or real(pid))
    journal = JournalWriter(str(tmp_path / "journal"))
    env = dict(os.environ, LOCAL_WORLD_SIZE="2")
    started = []

    def worker(rank):
        proc = subprocess.Popen([sys.executable, "-c", WORKER],
                                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)))
        started.append(proc)
        return proc

    def sampled():
        sample_once(sampler, now, now[0] + 10)
        return sorted(r["pid"] for r in records(tmp_path)[-1]["ranks"])

    def pids(procs) -> list[int]:
        return sorted(p.pid for p in procs)

    try:
        first = worker(0)
        now = [1_720_000_000.0]
        sampler = ranksample.RankSampler(journal, str(tmp_path), 10.0, clock=lambda: now[0])
        sampled_until(sampler, now, tmp_path, bool, "the child's environ readable as a worker's")
        searches.clear()
        assert sampled() == [first.pid] and len(searches) == 1  # one of two: look again
        second = worker(1)
        wait_for_sync(lambda: sampled() == pids([first, second]), 30, "the new worker found",
                      every=0)
        searches.clear()
        for _ in range(3):  # both found: no more searches while they live
            assert sampled() == pids([first, second])
        assert searches == []
        first.kill()
        first.wait()  # reaped: gone from /proc (a zombie would count as gone too)
        third = worker(0)
        wait_for_sync(lambda: sampled() == pids([second, third]), 30, "the new worker found",
                      every=0)
        assert searches, "a worker went: the workers were searched for again"
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        journal.close()
