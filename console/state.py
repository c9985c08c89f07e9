"""RunState: what the console knows about a run, as plain data. No asyncio, no Textual.

Records in, plain data out: the RunController feeds it journal records and supervisor
states from every node (``apply_records``, ``apply_supervisor_state``: the reducer); the
headless printer and the TUI read it and subscribe to :class:`LineBatch` callbacks. What
time alone changes (stalls, a rendezvous that waits, asking again who is stuck) is ruled in
console/liveness.py. Every buffer is bounded (lines and loss points per rank in
console/buffers.py, events here). Over 450 lines: the records (data, metrics, files,
checkpoints, events, samples) act on the same nodes and ranks, and the status document
reads them all.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .buffers import BUDGET_MB, Kept, LineBudget, Series
from .checkpoints import Checkpoints
from .consoles import Operators
from . import rendezvous
from .lines import split_lines
from . import ownership
from .sanitize import NO_SECRETS, Masker, clean
from agent.judge_rules import how_it_ended
from agent.rankcpu import AGAIN_TEXT, RankCpu
from agent.straggler import Stragglers
from .telemetry import hardware_events, hardware_of, node_row
from .text import human_bytes, kill_summary
from agent.protocol import ProtocolError

LINES_PER_RANK = 5000
LINES_PER_NODE = 2000
EVENTS = 2000
STALL_MIN_S = 60.0  # --stall-after's default (the rules: console/liveness.py)

ENDED = ("exited", "failed", "stopped")  # a node's end states
RUN_ENDED = ("succeeded", "failed", "stopped")  # a run's end states (RunState.run_state)


@dataclass
class FileInfo:
    """A followed log file on a node: which rank's, which stream, which torchrun attempt."""

    fid: int
    rank: int | None
    local_rank: int | None
    stream: str
    attempt: int | None
    instance: str | None
    path: str
    partial: str = ""
    journal: int | None = None  # where it was announced in the node's journal
    claim: int | None = None  # a rank another node still runs: held (console/ownership.py)
    pid: int | None = None
    ts: float | None = None


@dataclass
class LineBatch:
    """New bytes of one file of one node, cut at line ends (``lines``); ``text`` is the raw data.

    ``journal`` is where the record starts in the node's journal (None from an agent that does
    not say): with a line's index in ``lines`` it is the line's position, which scrolling back
    asks the node for what came before (console/scrollback.py).
    """

    node: str
    rank: int | None
    local_rank: int | None
    stream: str
    path: str
    offset: int
    text: str
    lines: list[str]
    ts: float
    journal: int | None = None


@dataclass
class RankState:
    rank: int
    node: str
    local_rank: int | None = None
    pid: int | None = None  # the worker process (its newest file's), for the GPU panel
    state: str = "starting"
    step: int | None = None
    loss: float | None = None
    lr: float | None = None
    step_time: float | None = None
    tok_s: float | None = None
    diverged: int | None = None  # the step of its first loss that was inf or NaN
    last_progress: float | None = None
    reports: bool = False  # it has printed a metric; a silent one steps with the run's ranks
    started: float | None = None  # when its newest worker's file appeared
    step_times: deque = field(default_factory=lambda: deque(maxlen=64))
    points: Series = field(default_factory=Series)
    lines: Kept = field(default_factory=lambda: Kept(LINES_PER_RANK))

    def idle_s(self, now: float) -> float | None:
        return None if self.last_progress is None else max(0.0, now - self.last_progress)


@dataclass
class NodeState:
    name: str
    addr: str = ""
    state: str = "connecting"
    cause: str | None = None
    exit_code: int | None = None
    restarts: int = 0  # restarts rankdeck made (node restarts)
    max_restarts: int = 0
    files: dict[int, FileInfo] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)  # torchrun instance -> max attempt
    instance: str | None = None  # the newest torchrun start's log folder
    journal_offset: int = 0
    data_from: int = 0  # journal offset from which its log lines were received (a resumed attach)
    lines: Kept = field(default_factory=lambda: Kept(LINES_PER_NODE))  # lines of no rank
    gpu: dict | None = None
    host: dict | None = None  # the agent's host sample (agent/hoststats.py), sent with gpu
    phase: dict | None = None  # its torchrun's phase (console/rendezvous.py), from state.json
    worker_failure: dict | None = None  # the newest worker_failed of its current torchrun
    state_seen: bool = False  # a state message (its state.json) has arrived (caught_up waits)
    stream_end: int | None = None  # its agent can read its journal no further than this
    hardware: tuple | None = None  # (gpu, host, their telemetry.hardware_row): hardware_of
    slots: int = 1  # its processes (the inventory's slots): bounds its records (ownership.py)
    stray: FileInfo | None = None  # bytes of files never announced (or long forgotten)
    # "active", or "spare" / "cordoned" (docs/SURGERY.md): a node of another role shows
    # that role as its state, whatever its agent says, and the run's end does not wait for it
    role: str = "active"
    warm: bool = False  # a spare whose torchrun waits held before the rendezvous (launch)

    @property
    def torchrun_restarts(self) -> int:
        return sum(self.attempts.values())

    @property
    def restarts_used(self) -> int:
        return self.restarts + self.torchrun_restarts

    @property
    def restarts_left(self) -> int:
        return max(0, self.max_restarts - self.attempts.get(self.instance, 0))

    @property
    def ended(self) -> bool:
        return self.state in ENDED or self.role != "active"


@dataclass
class Event:
    ts: float
    node: str | None
    kind: str  # launched, checkpoint, restarting, restarted, exited, failed, stopped, stalled...
    text: str
    rank: int | None = None


class RunState:
    """Everything known about one run; fed by the controller, read by the views."""

    def __init__(self, run_id: str, nodes: list[tuple[str, str]], max_restarts: int = 0,
                 stall_min_s: float = STALL_MIN_S, lines_per_rank: int = LINES_PER_RANK,
                 line_budget: int = BUDGET_MB << 20, slots: dict[str, int] | None = None):
        self.run_id = run_id
        self.lines_per_rank = lines_per_rank  # older lines are fetched from the nodes on demand
        self.budget = LineBudget(line_budget)  # for all kept lines: memory by budget, not rank
        self.nodes: dict[str, NodeState] = {
            name: NodeState(name=name, addr=addr, max_restarts=max_restarts,
                            lines=Kept(LINES_PER_NODE, self.budget),
                            slots=(slots or {}).get(name, ownership.DEFAULT_SLOTS))
            for name, addr in nodes
        }
        self.nproc: int | None = None  # the launch's --nproc-per-node, when it has one
        # what starts each node (console/launchers.py): torchrun, deepspeed, accelerate, or
        # "launcher" for a raw argv; named where a phase or a start is said
        self.launcher = "torchrun"
        self.ranks: dict[int, RankState] = {}
        self.held: list[tuple[str, int]] = []  # (node, file id) of claims held (ownership.py)
        self.events: deque[Event] = deque(maxlen=EVENTS)
        self.started = time.time()
        self.stall_min_s = stall_min_s
        self.line_listeners: list[Callable[[LineBatch], None]] = []
        self.event_listeners: list[Callable[[Event], None]] = []
        self.change_listeners: list[Callable[[str], None]] = []
        self.record_listeners: list[Callable[[str, dict], None]] = []
        self.total_lines = 0
        self.world_size: int | None = None
        self.waiting: dict | None = None  # the rendezvous waited in too long (liveness.py)
        # a Slurm run's job now (console/slurm.py job_now), ``at`` when asked: the header's
        # time left
        self.slurm: dict | None = None
        # the run's secrets: masked in every line, event text and cause as they come in
        self.masker: Masker = NO_SECRETS
        self.checkpoints = Checkpoints()
        self.ran = False  # a rank has stepped: the run is never `starting` again
        self.silent_waiting: set[int] = set()  # silent ranks the run's next step wakes
        self.verdict: dict | None = None  # who is stuck (agent/verdict.py), while stalled
        self.verdict_at = 0.0  # when it was taken
        self.verdict_tries = 0  # looks again at an unknown verdict (console/liveness.py)
        self.judge: dict | None = None  # the judge on the hosts, its settings (console/judged.py)
        self.judge_offset = 0  # in the judge's journal
        self.stall_min_given = False  # `--stall-after` given to this console: it wins
        self.judge_stalled: set[int] = set()  # ranks the judge says are stalled
        # surgeries the judge did itself (--auto-cordon): {who, what, when, node, spare,
        # outcome, left, gpu}; console/cordon.py follow_judge keeps them in the run record
        self.judge_surgeries: list[dict] = []
        self.stragglers = Stragglers()  # from the supervisors' samples (agent/ranksample.py)
        self.rank_cpu = RankCpu()  # silent ranks' CPU, from the same samples
        self.operators = Operators()  # consoles attached, the action log (console/consoles.py)

    # -- feeding ---------------------------------------------------------------------------
    def set_verdict(self, verdict: dict) -> None:
        """Keep who is stuck, and say it as an event (the summary line) when it is news: a
        verdict taken again while the stall goes on says nothing if nothing changed."""
        old, self.verdict = self.verdict, verdict
        self.verdict_at = time.time()
        if old is None or (old["kind"], old["summary"]) != (verdict["kind"], verdict["summary"]):
            self.add_event(None, "verdict", "%s: %s" % (verdict["kind"], verdict["summary"]))

    def add_event(self, node: str | None, kind: str, text: str, rank: int | None = None,
                  ts: float | None = None) -> None:
        ev = Event(ts or time.time(), node, kind, self.masker.mask(text), rank)
        self.events.append(ev)
        for cb in self.event_listeners:
            cb(ev)

    def set_role(self, node: str, role: str) -> None:
        """``node`` becomes ``role`` (active, spare, cordoned); an active node's state is its
        agent's again from its next record."""
        ns = self.nodes[node]
        ns.role = role
        ns.state = role if role != "active" else "starting"
        self.changed(node)

    def set_slurm(self, now: dict) -> None:
        """A Slurm run's job now (``slurm``); a node whose Slurm state (``nodes``: drained,
        down, failing) is new or gone is changed, so the views redraw its row."""
        before = (self.slurm or {}).get("nodes") or {}
        self.slurm = now
        words = now.get("nodes") or {}
        for name in sorted(set(before) | set(words)):
            if before.get(name) != words.get(name) and name in self.nodes:
                self.changed(name)

    def changed(self, node: str) -> None:
        ns = self.nodes.get(node)
        if ns is not None and ns.role != "active":
            ns.state = ns.role  # whatever its journal or agent said since
        for cb in self.change_listeners:
            cb(node)

    def apply_telemetry(self, node: str, snap: dict | None, host: dict | None) -> None:
        """A ``gpu`` message: the node's new GPU snapshot and host sample; what changed on
        the hardware since the last one (Xid, ECC, throttling, a link down) becomes an event."""
        ns = self.nodes[node]
        for kind, text in hardware_events(ns.gpu, snap, ns.host, host):
            self.add_event(node, kind, clean(text, self.masker))
        ns.gpu, ns.host = snap, host
        hardware_of(ns)  # made here, one node at a time, not for all nodes at a redraw
        self.changed(node)

    def set_node(self, node: str, state: str, cause: str | None = None) -> None:
        ns = self.nodes[node]
        cause = clean(cause, self.masker) if cause else cause  # often a host's text
        if ns.state != state or ns.cause != cause:
            ns.state, ns.cause = state, cause
            self.changed(node)

    def apply_records(self, node: str, recs: list, end: int) -> None:
        """Journal records from a node's agent (the ``recs`` of a ``journal`` message)."""
        ns = self.nodes[node]
        for rec in recs:
            meta = rec[0]
            if meta.get("j") is not None:  # a record refused: a reconnect resumes at it
                ns.journal_offset = meta["j"]
            kind = meta.get("k")
            if kind == "data":
                self._data(ns, meta, rec[1] if len(rec) > 1 else "")
            elif kind == "metric":
                self._metric(ns, meta)
            elif kind == "file":
                self._file(ns, meta)
            elif kind == "ckpt":
                self._checkpoint(ns, meta)
            elif kind in ("ckpt_done", "resumed"):
                self._checkpoint_news(ns, meta)
            elif kind == "ckpt_gone":
                gone = self.checkpoints.gone(node, meta)
                if gone is not None:
                    self.add_event(node, "checkpoint deleted", "checkpoint step %s deleted by "
                                   "the trainer: %s" % (gone.step, gone.path), gone.rank,
                                   meta.get("ts"))
            elif kind == "event":
                self._supervisor_event(ns, meta)
            elif kind == "sample":
                self._sample(ns, meta)
            for cb in self.record_listeners:  # export: every record, once the reducer has it
                cb(node, meta)
        ns.journal_offset = end
        if self.held:
            self._settle_claims()
        self.changed(node)

    def _checkpoint(self, ns: NodeState, meta: dict) -> None:
        fi = ns.files.get(meta.get("f"))
        ckpt = self.checkpoints.saved(ns.name, fi.rank if fi else None, meta)
        if ckpt is None:  # seen in --checkpoint-dir already
            return
        self.add_event(ns.name, "checkpoint", "checkpoint step %s saved: %s%s" % (
            ckpt.step, ckpt.path, " (%s)" % human_bytes(ckpt.bytes) if ckpt.bytes else ""),
            ckpt.rank, meta.get("ts"))

    def _checkpoint_news(self, ns: NodeState, meta: dict) -> None:
        """A save found complete or not (``ckpt_done``), a resume line (``resumed``)."""
        fi = ns.files.get(meta.get("f"))
        rank = fi.rank if fi else None
        if meta.get("k") == "resumed":
            got = self.checkpoints.resume(ns.name, rank, meta)
            if got is not None:
                self.add_event(ns.name, "resumed", "ranks resumed from checkpoint step %s: %s"
                               % (got.step, got.path or "?"), rank, meta.get("ts"))
            return
        ckpt = self.checkpoints.done(ns.name, meta)
        if ckpt is None:
            return
        if ckpt.complete:
            took = "" if ckpt.seconds is None else " in %.1f s" % ckpt.seconds
            kind, text = "checkpoint complete", "checkpoint step %s complete: %s%s" % (
                ckpt.step, human_bytes(ckpt.bytes or 0), took)
        else:
            kind, text = "checkpoint incomplete", "checkpoint step %s incomplete: %s lacks %s" % (
                ckpt.step, ckpt.path, ", ".join(ckpt.missing or []) or "nothing named")
        self.add_event(ns.name, kind, text, ckpt.rank, meta.get("ts"))

    def _file(self, ns: NodeState, meta: dict) -> None:
        fi = FileInfo(meta["f"], None, meta.get("local_rank"), meta.get("stream", "stdout"),
                      meta.get("attempt"), meta.get("instance"), meta.get("path", ""),
                      journal=meta.get("j"), pid=meta.get("pid"), ts=meta.get("ts"))
        rank = meta.get("rank")
        ownership.check_claim(ns, fi, rank, self.nproc)  # ProtocolError past the node's bounds
        ns.files[fi.fid] = fi
        if fi.instance is not None and fi.attempt is not None:
            ns.attempts[fi.instance] = max(ns.attempts.get(fi.instance, 0), fi.attempt)
            ns.instance = fi.instance
        ownership.forget_old_files(ns, self.nproc)
        size = meta.get("world_size")
        if size and size != self.world_size:
            if self.world_size is not None:
                self.add_event(ns.name, "world", "world size %d -> %d" % (self.world_size, size),
                               ts=meta.get("ts"))
            self.world_size = size
            for rs in self.ranks.values():  # ranks beyond the new world are gone
                if rs.rank >= size and rs.state not in ("exited", "failed"):
                    rs.state = "exited"
        if rank is None:
            return
        if ownership.can_take(self, ns, rank):
            self._own(ns, fi, rank)
        else:  # another node still runs it: held until that node lets it go
            fi.claim = rank
            self.held.append((ns.name, fi.fid))

    def _own(self, ns: NodeState, fi: FileInfo, rank: int) -> None:
        """``fi`` is ``rank``'s newest file: the rank is on ``ns`` now."""
        fi.rank, fi.claim = rank, None
        rs = self.ranks.get(rank)
        if rs is None:
            self._make_room()
            rs = self.ranks[rank] = RankState(rank, ns.name,
                                              lines=Kept(self.lines_per_rank, self.budget))
        rs.node = ns.name
        rs.local_rank = fi.local_rank
        rs.pid = fi.pid  # None rather than an earlier, ended worker's pid
        rs.started = fi.ts or time.time()
        if rs.state in ("exited", "failed"):
            rs.state = "starting"
        if not rs.reports and rs.state == "starting":
            self.silent_waiting.add(rs.rank)

    def _make_room(self) -> None:
        """One more rank fits: at most as many as the nodes may run, forgetting ranks no node
        runs any more (a node that claims a new attempt's ranks again and again)."""
        most = sum(ownership.ranks_cap(ns, self.nproc) for ns in self.nodes.values())
        if len(self.ranks) < most:
            return
        for rank in ownership.idle_ranks(self)[:len(self.ranks) - most + 1]:
            del self.ranks[rank]
            self.silent_waiting.discard(rank)
        if len(self.ranks) >= most:
            raise ProtocolError("more than %d ranks claimed, all still running" % most)

    def _settle_claims(self) -> None:
        """Grant the held claims whose rank its owner let go; drop those gone stale."""
        still = []
        for name, fid in self.held:
            ns = self.nodes[name]
            fi = ns.files.get(fid)
            if fi is None or fi.claim is None:
                continue
            if ns.ended or ownership.generation(fi) != ownership.newest(ns):
                fi.claim = None  # its node moved on: the claim is of a worker long gone
            elif ownership.can_take(self, ns, fi.claim):
                self._own(ns, fi, fi.claim)
            else:
                still.append((name, fid))
        self.held = still

    def _data(self, ns: NodeState, meta: dict, text: str) -> None:
        fi = ns.files.get(meta.get("f"))
        if fi is None:  # data for a file we never saw announced (or forgot): on the node
            fi = ns.stray = ns.stray or FileInfo(-1, None, None, "unknown", None, None, "")
        lines, fi.partial = split_lines(fi.partial, text, self.masker)
        self.total_lines += len(lines)
        ts, journal = meta.get("ts", 0.0), meta.get("j")
        if fi.rank is not None and fi.rank in self.ranks:
            self.ranks[fi.rank].lines.add(ts, ns.name, journal, lines)
        else:
            ns.lines.add(ts, ns.name, journal, lines)
        batch = LineBatch(ns.name, fi.rank, fi.local_rank, fi.stream, fi.path, meta.get("o", 0),
                          text, lines, ts, journal)
        for cb in self.line_listeners:
            cb(batch)

    def _metric(self, ns: NodeState, meta: dict) -> None:
        fi = ns.files.get(meta.get("f"))
        if fi is None or fi.rank is None or fi.rank not in self.ranks:
            return
        rs = self.ranks[fi.rank]
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
            rs.points.append((step, meta["loss"]))  # finite ones: console/buffers.py
        if rs.diverged is None and meta.get("loss") is not None \
                and not math.isfinite(meta["loss"]):
            rs.diverged = step if step is not None else rs.step
            self.add_event(ns.name, "diverged", "rank %d diverged: loss %s at step %s"
                           % (rs.rank, meta["loss"], rs.diverged), rs.rank, meta.get("ts"))
        rs.last_progress = meta.get("ts") or time.time()
        rs.reports = True
        self.silent_waiting.discard(rs.rank)
        self._stepping(rs, "stepping again (step %s)" % step)
        if self.silent_waiting:
            self._wake_silent(rs.last_progress)

    def _sample(self, ns: NodeState, meta: dict) -> None:
        """A supervisor's periodic sample of its ranks: who enters collectives last
        (agent/straggler.py), and whose CPU advances (agent/rankcpu.py)."""
        for rank, kind, text in self.stragglers.add(meta, self.world_size):
            if self.judge is not None:
                continue  # the judge says it (console/judged.py); the view still marks it
            node = self.ranks[rank].node if rank in self.ranks else ns.name
            self.add_event(node, kind, text, rank, meta.get("ts"))
        moved = self.rank_cpu.add(meta)
        wake = [r for r in moved if r in self.ranks and self.ranks[r].state == "starting"
                and not self.ranks[r].reports]
        if moved and not any(r.reports for r in self.ranks.values()):
            wake += [r for r, rs in self.ranks.items() if rs.state == "stalled"]
        for rank in sorted(set(wake)):
            self.silent_waiting.discard(rank)
            self._stepping(self.ranks[rank], AGAIN_TEXT)

    def _stepping(self, rs: RankState, again: str) -> None:
        """``rs`` makes progress: it runs (saying so when it had stalled), and so does its node."""
        self.ran = True
        if rs.state in ("starting", "stalled"):
            if rs.state == "stalled":
                self.add_event(rs.node, "recovered", "rank %d %s" % (rs.rank, again), rs.rank)
                self.verdict = None  # it was about the stall that just ended
            rs.state = "running"
        ns = self.nodes.get(rs.node)
        if ns is not None and ns.state == "starting":
            ns.state = "running"

    def _wake_silent(self, ts: float) -> None:
        """The run stepped at ``ts``: every silent rank whose worker had started by then and
        whose node still runs is running too (DDP ranks step together; a Hugging Face Trainer
        prints on rank 0 only)."""
        for rank in list(self.silent_waiting):
            rs = self.ranks.get(rank)
            ns = self.nodes.get(rs.node) if rs is not None else None
            if rs is None or ns is None or ns.ended or rs.state in ("exited", "failed"):
                self.silent_waiting.discard(rank)
            elif rs.started is None or rs.started <= ts:
                self.silent_waiting.discard(rank)
                self._stepping(rs, "running again with the run (it prints no steps)")

    def _supervisor_event(self, ns: NodeState, meta: dict) -> None:
        what = meta.get("what")
        ts = meta.get("ts")
        if what == "launched":
            ns.state = "starting"
            ns.worker_failure = None
            self.add_event(ns.name, "launched", "%s started (pid %s, launch %s)" % (
                self.launcher, meta.get("pid"), meta.get("launch")), ts=ts)
        elif what == "restarting":
            ns.state = "restarting"
            self.add_event(ns.name, "restarting", "restart requested", ts=ts)
        elif what == "worker_failed":
            ns.worker_failure = meta
            self.add_event(ns.name, "worker failed", "rank %s (local rank %s) %s; torchrun "
                           "restarts its workers if it has restarts left" % (
                               meta.get("rank"), meta.get("local_rank"),
                               how_it_ended(meta.get("exit_code"))), meta.get("rank"), ts)
        elif what == "killed":
            report = meta.get("report") or {}
            self.add_event(ns.name, "killed", kill_summary(report), ts=ts)
        elif what == "stopping":
            ns.state = "stopping"
            self.add_event(ns.name, "stopping", "stop requested", ts=ts)
        elif what == "ended":
            state = meta.get("state")
            ns.exit_code = meta.get("exit_code")
            cause = meta.get("cause") or {}
            ns.cause = clean(cause.get("message") or "", self.masker) or None
            ns.state = state
            for rs in self.ranks.values():
                if rs.node == ns.name and rs.state != "failed":
                    rs.state = "failed" if state == "failed" else "exited"
            if state == "failed" and cause.get("rank") is not None:
                bad = self.ranks.get(cause["rank"])
                if bad:
                    bad.state = "failed"
            known = ns.exit_code is not None  # a node rankdeck ended has none (console/finish.py)
            text = {"exited": "exited %s" % ns.exit_code if known else "exited",
                    "stopped": "stopped: %s" % ns.cause if ns.cause else "stopped"}.get(
                state, "failed%s: %s" % (" (exit %s)" % ns.exit_code if known else "", ns.cause))
            self.add_event(ns.name, state, text, cause.get("rank") if cause else None, ts=ts)

    def apply_supervisor_state(self, node: str, st: dict | None) -> None:
        """A node's state.json (from a ``state`` message)."""
        if not st:
            return
        ns = self.nodes[node]
        ns.state_seen = True
        # null is "not said" (the checks let it through): the counts as they were
        if st.get("restarts") is not None:
            ns.restarts = st["restarts"]
        if st.get("max_restarts") is not None:
            ns.max_restarts = st["max_restarts"]
        if "phase" in st:
            ns.phase = rendezvous.phase_of(st["phase"], self.masker)
        sup = st.get("state")
        if sup == "lost" and ns.state != "lost":
            ns.state = "lost"
            ns.cause = "supervisor died; processes may be left (rankdeck stop kills them)"
            self.add_event(node, "lost", ns.cause)
        elif sup in ENDED and not ns.ended:
            ns.state = sup
            ns.exit_code = st.get("exit_code")
            cause = st.get("cause") or {}
            ns.cause = clean(cause.get("message") or "", self.masker) or None
        elif sup in ("restarting", "stopping"):
            ns.state = sup
        elif sup == "running" and ns.state in ("connecting", "unreachable", "lost"):
            ns.state = "starting" if not self._node_stepping(node) else "running"
        if self.held:
            self._settle_claims()
        self.changed(node)

    def _node_stepping(self, node: str) -> bool:
        return any(r.node == node and r.state == "running" for r in self.ranks.values())

    # -- reading ---------------------------------------------------------------------------
    def run_state(self) -> str:
        states = [n.state for n in self.nodes.values() if n.role == "active"]
        # a node whose supervisor died without an end (`lost`: killed, the host rebooted, a
        # Slurm step's cgroup ended under it) runs no more: with every other node ended, the
        # run failed
        if all(s in ENDED or s == "lost" for s in states):
            if all(s == "exited" for s in states):
                return "succeeded"
            if any(s in ("failed", "lost") for s in states):
                return "failed"
            return "stopped"
        # once a rank stepped, ranks that exit first (their node done) or a restart do not
        # make the run `starting` again
        if self.ran or any(r.state in ("running", "stalled") for r in self.ranks.values()):
            return "running"
        return "starting"

    def ranks_of(self, node: str) -> list[RankState]:
        return sorted((r for r in self.ranks.values() if r.node == node), key=lambda r: r.rank)

    def status(self, now: float | None = None) -> dict:
        """The ``status --json`` document (schema in docs/STATUS.md; keep it stable)."""
        now = now or time.time()
        nodes = []
        for ns in self.nodes.values():
            ranks = []
            for rs in self.ranks_of(ns.name):
                idle = rs.idle_s(now)
                ranks.append({
                    "rank": rs.rank, "local_rank": rs.local_rank, "state": rs.state,
                    "step": rs.step, "loss": rs.loss, "lr": rs.lr, "step_time": rs.step_time,
                    "tok_s": rs.tok_s, "idle_s": None if idle is None else round(idle, 1),
                    "silent": not rs.reports, "cpu_s": self.rank_cpu.cpu_s(rs.rank),
                    "straggler": rs.rank in self.stragglers.flagged,
                    "slowdown": self.stragglers.slowdown(rs.rank),
                    "diverged": rs.diverged,
                })
            nodes.append({
                "name": ns.name, "addr": ns.addr, "state": ns.state, "cause": ns.cause,
                "restarts_used": ns.restarts_used, "restarts_left": ns.restarts_left,
                "exit_code": ns.exit_code, "ranks": ranks,
                "host": node_row(ns, self.ranks_of(ns.name))
                if ns.gpu or ns.host else None,
                "phase": dict(ns.phase, text=rendezvous.phase_text(ns.phase))
                if ns.phase else None,
            })
        return {"run_id": self.run_id, "state": self.run_state(), "launcher": self.launcher,
                "nodes": nodes,
                "started": self.started, "events": len(self.events),
                "world_size": self.world_size, "checkpoints": self.checkpoints.status(),
                "resumed_from": self.checkpoints.resumed_status(),
                "waiting_for": self.waiting, "verdict": self.verdict}

