"""Goodput's bounded reducer (agent/rules/goodput.py, its steps as segments:
agent/rules/goodput_steps.py) against the brute-force reference it replaced
(tests/unit/goodput_reference.py: every step kept, every figure reduced again): the same records
of scripted runs, with restarts, resumes from older checkpoints, stalls that end by themselves
and stalls restarted, actions with no stall, rendezvous waits, checkpoint saves and hosts' clocks
off the judge's, give the same buckets, incidents and work at risk. And what it keeps stays
bounded: a rank's segments, not its steps."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from agent.rules.goodput import Goodput
from agent.rules.goodput_steps import MAX_SEGMENTS
from tests.unit.goodput_reference import Goodput as Reference


def scripted_run(seed: int):
    """(node, meta) records of a run in the order they are made (each node's journal in its
    order; the judge's events when it writes them), a node's time on its own clock."""
    rnd = random.Random(seed)
    nodes = rnd.randint(1, 4)
    per_node = rnd.randint(1, 3)
    ranks = nodes * per_node
    # a host's clock far off the judge's is put right by its ranks' stalls (the first incident
    # then a stall of every rank); with none, hosts with NTP are milliseconds apart
    off = rnd.random() < 0.5
    skew = {"node%d" % n: rnd.uniform(-0.5, 0.5) if off else rnd.uniform(-0.005, 0.005)
            for n in range(nodes)}
    pace = rnd.choice([0.1, 0.5, 1.0, 3.0])
    ckpt_every = rnd.choice([5, 10, 25])
    twice = rnd.choice([1, 1, 2])
    out = []  # (judge time, order, node, meta)

    newest = {}  # rank -> judge time of its newest step record (the judge's idle counts from it)

    def node_rec(node, t, meta):
        out.append((t, len(out), node, dict(meta, ts=t + skew[node])))
        if meta["k"] == "metric":
            newest[meta["f"] // 1000] = max(t, newest.get(meta["f"] // 1000, t))

    def judge(t, what, **fields):
        out.append((t, len(out), None, dict({"k": "event", "what": what, "node": None},
                                             ts=t, **fields)))

    judge(0.0, "judge", action="started", stall_after=6.0)
    fid = {r: 1000 * r for r in range(ranks)}  # each rank its files
    for n in range(nodes):
        node_rec("node%d" % n, 0.5, {"k": "event", "what": "launched"})
    for r in range(ranks):
        node_rec("node%d" % (r // per_node), 0.6, {"k": "file", "f": fid[r], "rank": r})
    t, step, complete = rnd.uniform(5, 30), 0, 0
    if rnd.random() < 0.5:  # a rendezvous wait before the first step
        judge(t - 2.0, "waiting", waited_s=3.0, round=1)
        judge(t - 0.5, "waiting over", round=1)
    for incident in range(rnd.randint(1, 4)):
        for _ in range(rnd.randint(10, 80)):
            step += 1
            t += pace * rnd.uniform(0.9, 1.1)
            for r in range(ranks):
                for again in range(twice):  # a trainer that prints a step in two lines
                    node_rec("node%d" % (r // per_node), t + 0.005 * again,
                             {"k": "metric", "step": step, "loss": 1.0, "f": fid[r]})
            if step % ckpt_every == 0:
                save = rnd.uniform(0.5, 4 * pace)
                for r in range(ranks):
                    node_rec("node%d" % (r // per_node), t + save + rnd.uniform(0, 0.2),
                             {"k": "ckpt", "step": step, "path": "/c/%d" % step, "f": fid[r]})
                node_rec("node0", t + save + 0.5, {"k": "ckpt_done", "step": step,
                                                   "path": "/c/%d" % step, "complete": True})
                complete = step
                t += save
        kind = rnd.choice(["restart", "restart", "self", "crash", "wait"])
        if off and incident == 0:
            kind = "restart"
        if kind == "wait":  # a rendezvous wait while the ranks still step
            judge(t + 0.2, "waiting", waited_s=rnd.uniform(0, 2), round=2)
            judge(t + rnd.uniform(1, 5), "waiting over", round=2)
            continue
        last = t
        if kind == "crash":  # a worker died: the judge's restart, no stall before it
            t += rnd.uniform(1, 5)
            judge(t, "restarted", node="node0", reason="on-failure")
        else:
            seen = last + 6.0 + rnd.uniform(0, 1)
            for r in rnd.sample(range(ranks), ranks if off and incident == 0 else
                                rnd.randint(1, ranks)):
                judge(seen, "stalled", node="node%d" % (r // per_node), rank=r, step=step,
                      idle_s=seen - newest[r])
            judge(seen + rnd.uniform(0.5, 2), "verdict", verdict={
                "suspects": [{"rank": 0, "node": "node0"}]})
            t = seen + rnd.uniform(2, 4)
            if kind == "restart":
                judge(t, "policy", node="node0", action="restart", text="restarting")
                judge(t + 1.0, "restarted", node="node0", reason="on-hang")
        if kind != "self":  # a new attempt's files, resumed from the newest checkpoint
            t += rnd.uniform(5, 20)
            back = complete if rnd.random() < 0.7 else max(0, complete - ckpt_every)
            for r in range(ranks):
                fid[r] += 1
                node_rec("node%d" % (r // per_node), t - 1, {"k": "file", "f": fid[r],
                                                             "rank": r})
            step = back
        else:
            t += rnd.uniform(1, 3)
        t += pace
        step += 1
        for r in range(ranks):
            node_rec("node%d" % (r // per_node), t, {"k": "metric", "step": step,
                                                      "loss": 1.0, "f": fid[r]})
            judge(t + 0.3, "stepping", node="node%d" % (r // per_node), rank=r, step=step)
    for n in range(nodes):
        node_rec("node%d" % n, t + 3.0, {"k": "event", "what": "ended", "state": "stopped"})
    if rnd.random() < 0.5:
        judge(t + 4.0, "run_ended", state="stopped")
    out.sort(key=lambda rec: (rec[0], rec[1]))
    return [(node, meta) for _t, _i, node, meta in out]


def fed(records, reducer):
    for node, meta in records:
        reducer.add(node, meta)
    return reducer


def same(new: dict, ref: dict) -> None:
    assert new["wall_s"] == ref["wall_s"]
    assert new["ended"] == ref["ended"] and new["goodput"] == ref["goodput"]
    for bucket, seconds in ref["buckets"].items():
        assert new["buckets"][bucket] == pytest.approx(seconds, abs=2e-3), bucket
    assert new["incidents"] == ref["incidents"]
    assert new["work_at_risk_gpu_h"] == ref["work_at_risk_gpu_h"]
    assert new["clock"] == ref["clock"] and new["ranks"] == ref["ranks"]


@pytest.mark.parametrize("seed", range(50))
def test_the_same_figures_as_every_step_kept(seed):
    records = scripted_run(seed)
    same(fed(records, Goodput()).report(), fed(records, Reference()).report())


@pytest.mark.parametrize("seed", range(10))
def test_the_same_figures_with_the_judges_journal_read_first(seed):
    """A console's replay may read the judge's journal before the nodes' (its stalls then
    wait for the steps they name)."""
    records = scripted_run(seed)
    order = [r for r in records if r[0] is None] + [r for r in records if r[0] is not None]
    same(fed(order, Goodput()).report(), fed(order, Reference()).report())


@pytest.mark.parametrize("seed", range(10))
def test_the_same_figures_live_as_the_run_goes_on(seed):
    """The header's case: a report now and then while the records come."""
    records = scripted_run(seed)
    new, ref = Goodput(), Reference()
    for i, (node, meta) in enumerate(records):
        new.add(node, meta)
        ref.add(node, meta)
        if i % 97 == 0:
            now = meta["ts"] + 1.0
            same(new.report(now), ref.report(now))


def test_what_it_keeps_is_bounded_by_ranks_not_steps():
    """16 ranks x 20,000 steps, a restart every 2,000: a rank keeps at most MAX_SEGMENTS
    segments; the reference keeps 16 bytes a step a rank."""
    def run(reducer, steps):
        for r in range(16):
            reducer.add("node0", {"k": "file", "f": r, "rank": r})
        t = 0.0
        for step in range(1, steps + 1):
            t += 1.0 + (30.0 if step % 2000 == 0 else 0.0)
            shown = step - (step // 2000) * 100  # each restart resumed 100 steps back
            for r in range(16):
                reducer.add("node0", {"k": "metric", "step": shown, "f": r, "ts": t})
        return reducer

    tracemalloc.start()
    try:
        small = tracemalloc.take_snapshot()
        kept = run(Goodput(), 20000)
        size = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(small,
                                                                               "filename"))
    finally:
        tracemalloc.stop()
    assert all(len(rs.segs) <= MAX_SEGMENTS for rs in kept.ranks.values())
    assert size < 16 * 20000 * 16 / 4, size  # a quarter of the reference's arrays at most
