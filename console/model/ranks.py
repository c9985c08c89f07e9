"""Which node runs each rank, and how the ranks progress: the part of the reducer (console/
state_apply.py) that a ``file`` record's rank claim (console/model/ownership.py's rules), a
``metric`` record and a supervisor's ``sample`` change. ``run`` is the RunState
(console/model/state.py) they act on; a rank that steps again after a stall says so here, as does
one whose loss diverged.
"""

from __future__ import annotations

import time

from agent.wire.protocol import ProtocolError
from agent.rules.judge import nan_loss
from agent.rules.rankcpu import AGAIN_TEXT
from . import ownership
from .buffers import Kept
from .nodes import FileInfo, NodeState, RankState


def take_file(run, ns: NodeState, meta: dict) -> None:
    """A ``file`` record: a followed file announced, and the rank it claims taken now or
    held until its owner lets it go (console/model/ownership.py)."""
    fi = FileInfo(meta["f"], None, meta.get("local_rank"), meta.get("stream", "stdout"),
                  meta.get("attempt"), meta.get("instance"), meta.get("path", ""),
                  journal=meta.get("j"), pid=meta.get("pid"), ts=meta.get("ts"))
    rank = meta.get("rank")
    ownership.check_claim(ns, fi, rank, run.nproc)  # ProtocolError past the node's bounds
    ns.files[fi.fid] = fi
    if fi.instance is not None and fi.attempt is not None:
        ns.attempts[fi.instance] = max(ns.attempts.get(fi.instance, 0), fi.attempt)
        ns.instance = fi.instance
    ownership.forget_old_files(ns, run.nproc)
    size = meta.get("world_size")
    if size and size != run.world_size:
        if run.world_size is not None:
            run.add_event(ns.name, "world", "world size %d -> %d" % (run.world_size, size),
                          ts=meta.get("ts"))
        run.world_size = size
        for rs in run.ranks.values():  # ranks beyond the new world are gone
            if rs.rank >= size and rs.state not in ("exited", "failed"):
                rs.state = "exited"
    if rank is None:
        return
    if ownership.can_take(run, ns, rank):
        _own(run, ns, fi, rank)
    else:  # another node still runs it: held until that node lets it go
        fi.claim = rank
        run.held.append((ns.name, fi.fid))


def _own(run, ns: NodeState, fi: FileInfo, rank: int) -> None:
    """``fi`` is ``rank``'s newest file: the rank is on ``ns`` now."""
    fi.rank, fi.claim = rank, None
    rs = run.ranks.get(rank)
    if rs is None:
        _make_room(run)
        rs = run.ranks[rank] = RankState(rank, ns.name,
                                         lines=Kept(run.lines_per_rank, run.budget))
    rs.node = ns.name
    rs.local_rank = fi.local_rank
    rs.pid = fi.pid  # None rather than an earlier, ended worker's pid
    rs.started = fi.ts or time.time()
    if rs.state in ("exited", "failed"):
        rs.state = "starting"
    if not rs.reports and rs.state == "starting":
        run.silent_waiting.add(rs.rank)


def _make_room(run) -> None:
    """One more rank fits: at most as many as the nodes may run, forgetting ranks no node
    runs any more (a node that claims a new attempt's ranks again and again)."""
    most = sum(ownership.ranks_cap(ns, run.nproc) for ns in run.nodes.values())
    if len(run.ranks) < most:
        return
    for rank in ownership.idle_ranks(run)[:len(run.ranks) - most + 1]:
        del run.ranks[rank]
        run.silent_waiting.discard(rank)
    if len(run.ranks) >= most:
        raise ProtocolError("more than %d ranks claimed, all still running" % most)


def settle_claims(run) -> None:
    """Grant the held claims whose rank its owner let go; drop those gone stale."""
    still = []
    for name, fid in run.held:
        ns = run.nodes[name]
        fi = ns.files.get(fid)
        if fi is None or fi.claim is None:
            continue
        if ns.ended or ownership.generation(fi) != ownership.newest(ns):
            fi.claim = None  # its node moved on: the claim is of a worker long gone
        elif ownership.can_take(run, ns, fi.claim):
            _own(run, ns, fi, fi.claim)
        else:
            still.append((name, fid))
    run.held = still


def metric(run, ns: NodeState, meta: dict) -> None:
    """A ``metric`` record: its rank's step, loss and rates; the rank steps (and the silent
    ranks with it)."""
    fi = ns.files.get(meta.get("f"))
    if fi is None or fi.rank is None or fi.rank not in run.ranks:
        return
    rs = run.ranks[fi.rank]
    # The trainer's own step or none: a count of lines would drift from the trainer's
    # step (a dict line per logging_steps, evaluation lines) and mislabel the loss curve.
    step = meta.get("step")
    if step is not None:
        rs.step = step
    for key in ("loss", "lr", "step_time", "tok_s"):
        if meta.get(key) is not None:
            setattr(rs, key, meta[key])
    if meta.get("step_time") is not None:
        rs.step_times.append(meta["step_time"])
    if step is not None and meta.get("loss") is not None:
        rs.points.append((step, meta["loss"]))  # finite ones: console/model/buffers.py
    nan, rs.nan_streak = nan_loss(meta, rs.nan_streak)  # the judge's rule
    if rs.diverged is None and nan:
        rs.diverged = step if step is not None else rs.step
        run.add_event(ns.name, "diverged", "rank %d diverged: loss %s at step %s"
                      % (rs.rank, meta["loss"], rs.diverged), rs.rank, meta.get("ts"))
    rs.last_progress = meta.get("ts") or time.time()
    rs.reports = True
    run.silent_waiting.discard(rs.rank)
    _stepping(run, rs, "stepping again (step %s)" % step)
    if run.silent_waiting:
        _wake_silent(run, rs.last_progress)


def sample(run, ns: NodeState, meta: dict) -> None:
    """A supervisor's periodic sample of its ranks: who enters collectives last
    (agent/rules/straggler.py), and whose CPU advances (agent/rules/rankcpu.py)."""
    for rank, kind, text in run.stragglers.add(meta, run.world_size):
        if run.judge is not None:
            continue  # the judge says it (console/judgement/judged.py); the view still marks it
        node = run.ranks[rank].node if rank in run.ranks else ns.name
        run.add_event(node, kind, text, rank, meta.get("ts"))
    moved = run.rank_cpu.add(meta)
    for rank in moved:
        if rank in run.ranks:
            run.ranks[rank].busy = True  # as the judge's view marks it (agent/rules/judge_view.py)
    wake = [r for r in moved if r in run.ranks and run.ranks[r].state == "starting"
            and not run.ranks[r].reports]
    if moved and not any(r.reports for r in run.ranks.values()):
        wake += [r for r, rs in run.ranks.items() if rs.state == "stalled"]
    for rank in sorted(set(wake)):
        run.silent_waiting.discard(rank)
        _stepping(run, run.ranks[rank], AGAIN_TEXT)


def _stepping(run, rs: RankState, again: str) -> None:
    """``rs`` makes progress: it runs (saying so when it had stalled), and so does its node."""
    run.ran = True
    if rs.state in ("starting", "stalled"):
        if rs.state == "stalled":
            run.add_event(rs.node, "recovered", "rank %d %s" % (rs.rank, again), rs.rank)
            run.verdict = None  # it was about the stall that just ended
        rs.state = "running"
    ns = run.nodes.get(rs.node)
    if ns is not None and ns.state == "starting":
        ns.state = "running"


def _wake_silent(run, ts: float) -> None:
    """The run stepped at ``ts``: every silent rank whose worker had started by then and
    whose node still runs is running too (DDP ranks step together; a Hugging Face Trainer
    prints on rank 0 only)."""
    for rank in list(run.silent_waiting):
        rs = run.ranks.get(rank)
        ns = run.nodes.get(rs.node) if rs is not None else None
        if rs is None or ns is None or ns.ended or rs.state in ("exited", "failed"):
            run.silent_waiting.discard(rank)
        elif rs.started is None or rs.started <= ts:
            run.silent_waiting.discard(rank)
            _stepping(run, rs, "running again with the run (it prints no steps)")
