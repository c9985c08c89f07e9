"""RunState: what the console knows about a run, as plain data. No asyncio, no Textual.

The RunController feeds it journal records and supervisor states from every node; the
headless printer and the TUI read it and subscribe to :class:`LineBatch` callbacks. Every
buffer is bounded: lines per rank, loss points per rank, events.
"""

from __future__ import annotations

import statistics
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from agent.protocol import text_to_bytes

LINES_PER_RANK = 5000
LINES_PER_NODE = 2000
POINTS_PER_RANK = 4096
EVENTS = 2000
MAX_PARTIAL = 64 * 1024
STALL_MIN_S = 60.0
STALL_FACTOR = 5.0

ENDED = ("exited", "failed", "stopped")


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


# A line's position on its node: (journal offset of its record, index among the record's lines).
AFTER_RECORD = 1 << 62  # as an index: just past every line of that record


class Kept:
    """A stream's newest ``cap`` lines, in chunks as they came: one per journal record.

    A chunk is ``(ts, node, journal, lines, first)``: ``first`` is the index in its record of
    ``lines[0]`` (above 0 once the front of the chunk was dropped). Lines go from the front
    only, so what is kept from a node is everything of this stream from some position on, and
    :meth:`floor` says which. Behaves as a sequence of line texts for simple readers.
    """

    __slots__ = ("chunks", "count", "cap", "evicted", "per_node")

    def __init__(self, cap: int):
        self.chunks: deque = deque()
        self.count = 0
        self.cap = cap
        self.evicted: dict[str, tuple] = {}  # node -> newest dropped record's (offset, time)
        self.per_node: dict[str, int] = {}  # node -> chunks kept from it

    def add(self, ts: float, node: str, journal: int | None, lines: list[str]) -> None:
        if not lines:
            return
        chunks = self.chunks
        chunks.append((ts, node, journal, lines, 0))
        self.count += len(lines)
        self.per_node[node] = self.per_node.get(node, 0) + 1
        while self.count > self.cap:
            old_ts, old_node, old_journal, old_lines, first = chunks[0]
            excess = self.count - self.cap
            if excess >= len(old_lines):
                chunks.popleft()
                self.count -= len(old_lines)
                self.evicted[old_node] = (old_journal, old_ts)
                self.per_node[old_node] -= 1
            else:
                chunks[0] = (old_ts, old_node, old_journal, old_lines[excess:], first + excess)
                self.count -= excess

    def floor(self, node: str, start: int = 0) -> tuple:
        """``(position, edge)``: from which position on this stream's lines from ``node`` are
        all kept (None: unknown), and the time of the newest line dropped (None: none was).

        ``start``: where the console's data from that node began (0 unless resumed).
        """
        if self.per_node.get(node):
            for ts, chunk_node, journal, _lines, first in self.chunks:
                if chunk_node == node:
                    if first > 0:  # the front of this record went: same record, same time
                        return (None if journal is None else (journal, first)), ts
                    if node in self.evicted:
                        return (None if journal is None else (journal, 0)), \
                            self.evicted[node][1]
                    return (start, 0), None
        if node in self.evicted:
            journal, ts = self.evicted[node]
            return (None if journal is None else (journal, AFTER_RECORD)), ts
        return (start, 0), None

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for chunk in self.chunks:
            yield from chunk[3]

    def __getitem__(self, i: int) -> str:
        if i != -1:
            raise IndexError("Kept supports [-1] only; iterate for the rest")
        return self.chunks[-1][3][-1]

    def newest_first(self):
        """``(ts, node, journal, index, text)`` from the newest line back."""
        for ts, node, journal, lines, first in reversed(self.chunks):
            for k in range(len(lines) - 1, -1, -1):
                yield ts, node, journal, first + k, lines[k]


class Series:
    """A rank's (step, loss) points in bounded memory for runs of any length.

    When full, every other point is dropped and from then on only every 2nd (4th, ...) new
    point is kept: the whole run's curve stays, coarser as it grows (64 KiB per rank). The
    newest point is always part of the series.
    """

    __slots__ = ("steps", "values", "cap", "stride", "_skip", "last")

    def __init__(self, cap: int = POINTS_PER_RANK):
        self.steps = array("q")
        self.values = array("d")
        self.cap = cap
        self.stride = 1
        self._skip = 0
        self.last: tuple[int, float] | None = None

    def append(self, point: tuple[int, float]) -> None:
        self.last = (int(point[0]), float(point[1]))
        self._skip += 1
        if self._skip < self.stride:
            return
        self._skip = 0
        self.steps.append(int(point[0]))
        self.values.append(float(point[1]))
        if len(self.steps) >= self.cap:
            self.steps, self.values = self.steps[::2], self.values[::2]
            self.stride *= 2

    def _last_extra(self) -> bool:
        return self.last is not None and (not self.steps or self.steps[-1] != self.last[0])

    def __len__(self) -> int:
        return len(self.steps) + self._last_extra()

    def __iter__(self):
        yield from zip(self.steps, self.values)
        if self._last_extra():
            yield self.last

    def __getitem__(self, i: int) -> tuple[int, float]:
        if i == -1 and self.last is not None:
            return self.last
        return self.steps[i], self.values[i]


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
    last_progress: float | None = None
    step_times: deque = field(default_factory=lambda: deque(maxlen=64))
    points: Series = field(default_factory=Series)
    lines: Kept = field(default_factory=lambda: Kept(LINES_PER_RANK))

    def stall_threshold(self, minimum: float = STALL_MIN_S) -> float:
        """The larger of ``minimum`` and 5x the median step time."""
        if self.step_times:
            return max(minimum, STALL_FACTOR * statistics.median(self.step_times))
        return minimum

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
    launched_at: float | None = None
    files: dict[int, FileInfo] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)  # torchrun instance -> max attempt
    instance: str | None = None  # the newest torchrun start's log folder
    journal_offset: int = 0
    data_from: int = 0  # journal offset from which its log lines were received (a resumed attach)
    lines: Kept = field(default_factory=lambda: Kept(LINES_PER_NODE))  # lines of no rank
    gpu: dict | None = None
    kill_report: dict | None = None

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
        return self.state in ENDED


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
                 stall_min_s: float = STALL_MIN_S, lines_per_rank: int = LINES_PER_RANK):
        self.run_id = run_id
        self.lines_per_rank = lines_per_rank  # older lines are fetched from the nodes on demand
        self.nodes: dict[str, NodeState] = {
            name: NodeState(name=name, addr=addr, max_restarts=max_restarts)
            for name, addr in nodes
        }
        self.ranks: dict[int, RankState] = {}
        self.events: deque[Event] = deque(maxlen=EVENTS)
        self.started = time.time()
        self.stall_min_s = stall_min_s
        self.line_listeners: list[Callable[[LineBatch], None]] = []
        self.event_listeners: list[Callable[[Event], None]] = []
        self.change_listeners: list[Callable[[str], None]] = []
        self.total_lines = 0
        self.world_size: int | None = None

    # -- feeding ---------------------------------------------------------------------------
    def add_event(self, node: str | None, kind: str, text: str, rank: int | None = None,
                  ts: float | None = None) -> None:
        ev = Event(ts or time.time(), node, kind, text, rank)
        self.events.append(ev)
        for cb in self.event_listeners:
            cb(ev)

    def changed(self, node: str) -> None:
        for cb in self.change_listeners:
            cb(node)

    def set_node(self, node: str, state: str, cause: str | None = None) -> None:
        ns = self.nodes[node]
        if ns.state != state or ns.cause != cause:
            ns.state, ns.cause = state, cause
            self.changed(node)

    def apply_records(self, node: str, recs: list, end: int) -> None:
        """Journal records from a node's agent (the ``recs`` of a ``journal`` message)."""
        ns = self.nodes[node]
        for rec in recs:
            meta = rec[0]
            kind = meta.get("k")
            if kind == "data":
                self._data(ns, meta, rec[1] if len(rec) > 1 else "")
            elif kind == "metric":
                self._metric(ns, meta)
            elif kind == "file":
                self._file(ns, meta)
            elif kind == "ckpt":
                fi = ns.files.get(meta.get("f"))
                rank = fi.rank if fi else None
                size = meta.get("bytes")
                self.add_event(node, "checkpoint", "checkpoint step %s saved: %s%s" % (
                    meta.get("step"), meta.get("path"),
                    " (%s)" % human_bytes(size) if size else ""), rank, meta.get("ts"))
            elif kind == "event":
                self._supervisor_event(ns, meta)
        ns.journal_offset = end
        self.changed(node)

    def _file(self, ns: NodeState, meta: dict) -> None:
        fi = FileInfo(meta["f"], meta.get("rank"), meta.get("local_rank"),
                      meta.get("stream", "stdout"), meta.get("attempt"), meta.get("instance"),
                      meta.get("path", ""), journal=meta.get("j"))
        ns.files[fi.fid] = fi
        if fi.instance is not None and fi.attempt is not None:
            ns.attempts[fi.instance] = max(ns.attempts.get(fi.instance, 0), fi.attempt)
            ns.instance = fi.instance
        size = meta.get("world_size")
        if size and size != self.world_size:
            if self.world_size is not None:
                self.add_event(ns.name, "world", "world size %d -> %d" % (self.world_size, size),
                               ts=meta.get("ts"))
            self.world_size = size
            for rs in self.ranks.values():  # ranks beyond the new world are gone
                if rs.rank >= size and rs.state not in ("exited", "failed"):
                    rs.state = "exited"
        if fi.rank is not None:
            rs = self.ranks.get(fi.rank)
            if rs is None:
                rs = self.ranks[fi.rank] = RankState(fi.rank, ns.name,
                                                     lines=Kept(self.lines_per_rank))
            rs.node = ns.name
            rs.local_rank = fi.local_rank
            rs.pid = meta.get("pid", rs.pid)
            if rs.state in ("exited", "failed"):
                rs.state = "starting"

    def _data(self, ns: NodeState, meta: dict, text: str) -> None:
        fi = ns.files.get(meta.get("f"))
        if fi is None:  # data for a file we never saw announced: keep it on the node
            fi = ns.files[meta.get("f")] = FileInfo(meta.get("f"), None, None, "unknown", None,
                                                    None, "")
        joined = fi.partial + text if fi.partial else text
        lines = joined.split("\n")
        fi.partial = lines.pop()
        if len(fi.partial) > MAX_PARTIAL:  # a line with no end in sight: pass it on in pieces
            lines.append(fi.partial)
            fi.partial = ""
        if len(joined) > MAX_PARTIAL:  # a finished line can be huge too: store it in pieces
            lines = [piece for line in lines for piece in _pieces(line)]
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
        step = meta.get("step")
        if step is None and meta.get("loss") is not None:
            step = (rs.step or 0) + 1  # Hugging Face lines carry no step: count them
        if step is not None:
            rs.step = step
        for key in ("loss", "lr", "step_time", "tok_s"):
            if meta.get(key) is not None:
                setattr(rs, key, meta[key])
        if meta.get("step_time") is not None:
            rs.step_times.append(meta["step_time"])
        if step is not None and meta.get("loss") is not None:
            rs.points.append((step, meta["loss"]))
        rs.last_progress = meta.get("ts") or time.time()
        if rs.state in ("starting", "stalled"):
            if rs.state == "stalled":
                self.add_event(ns.name, "recovered", "rank %d stepping again (step %s)"
                               % (rs.rank, step), rs.rank)
            rs.state = "running"
        if ns.state == "starting":
            ns.state = "running"

    def _supervisor_event(self, ns: NodeState, meta: dict) -> None:
        what = meta.get("what")
        ts = meta.get("ts")
        if what == "launched":
            ns.launched_at = ts
            ns.state = "starting"
            self.add_event(ns.name, "launched", "torchrun started (pid %s, launch %s)"
                           % (meta.get("pid"), meta.get("launch")), ts=ts)
        elif what == "restarting":
            ns.state = "restarting"
            self.add_event(ns.name, "restarting", "restart requested", ts=ts)
        elif what == "killed":
            report = meta.get("report") or {}
            ns.kill_report = report
            self.add_event(ns.name, "killed", kill_summary(report), ts=ts)
        elif what == "stopping":
            ns.state = "stopping"
            self.add_event(ns.name, "stopping", "stop requested", ts=ts)
        elif what == "ended":
            state = meta.get("state")
            ns.exit_code = meta.get("exit_code")
            ns.kill_report = meta.get("kill")
            cause = meta.get("cause") or {}
            ns.cause = cause.get("message") if cause else None
            ns.state = state
            for rs in self.ranks.values():
                if rs.node == ns.name and rs.state != "failed":
                    rs.state = "failed" if state == "failed" else "exited"
            if state == "failed" and cause.get("rank") is not None:
                bad = self.ranks.get(cause["rank"])
                if bad:
                    bad.state = "failed"
            text = {"exited": "exited 0", "stopped": "stopped"}.get(
                state, "failed (exit %s): %s" % (ns.exit_code, ns.cause))
            self.add_event(ns.name, state, text, cause.get("rank") if cause else None, ts=ts)

    def apply_supervisor_state(self, node: str, st: dict | None) -> None:
        """A node's state.json (from a ``state`` message)."""
        if not st:
            return
        ns = self.nodes[node]
        ns.restarts = st.get("restarts", ns.restarts)
        ns.max_restarts = st.get("max_restarts", ns.max_restarts)
        sup = st.get("state")
        if sup == "lost" and ns.state != "lost":
            ns.state = "lost"
            ns.cause = "supervisor died; processes may be left (rankdeck stop kills them)"
            self.add_event(node, "lost", ns.cause)
        elif sup in ENDED and not ns.ended:
            ns.state = sup
            ns.exit_code = st.get("exit_code")
            cause = st.get("cause") or {}
            ns.cause = cause.get("message") if cause else None
        elif sup in ("restarting", "stopping"):
            ns.state = sup
        elif sup == "running" and ns.state in ("connecting", "unreachable", "lost"):
            ns.state = "starting" if not self._node_stepping(node) else "running"
        self.changed(node)

    def _node_stepping(self, node: str) -> bool:
        return any(r.node == node and r.state == "running" for r in self.ranks.values())

    # -- reading ---------------------------------------------------------------------------
    def check_stalls(self, now: float | None = None) -> list[RankState]:
        """Mark ranks with no progress for longer than their threshold as stalled."""
        now = now or time.time()
        newly = []
        for rs in self.ranks.values():
            if rs.state != "running" or rs.last_progress is None:
                continue
            if now - rs.last_progress > rs.stall_threshold(self.stall_min_s):
                rs.state = "stalled"
                newly.append(rs)
                self.add_event(rs.node, "stalled", "rank %d stalled: no step for %.0f s (last "
                               "step %s)" % (rs.rank, now - rs.last_progress, rs.step), rs.rank)
        return newly

    def run_state(self) -> str:
        states = [n.state for n in self.nodes.values()]
        if all(s in ENDED for s in states):
            if all(s == "exited" for s in states):
                return "succeeded"
            if any(s == "failed" for s in states):
                return "failed"
            return "stopped"
        if any(r.state in ("running", "stalled") for r in self.ranks.values()):
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
                })
            nodes.append({
                "name": ns.name, "addr": ns.addr, "state": ns.state, "cause": ns.cause,
                "restarts_used": ns.restarts_used, "restarts_left": ns.restarts_left,
                "exit_code": ns.exit_code, "ranks": ranks,
            })
        return {"run_id": self.run_id, "state": self.run_state(), "nodes": nodes,
                "started": self.started, "events": len(self.events),
                "world_size": self.world_size}


def _pieces(line: str) -> list[str]:
    if len(line) <= MAX_PARTIAL:
        return [line]
    return [line[i:i + MAX_PARTIAL] for i in range(0, len(line), MAX_PARTIAL)]


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "?"


def kill_summary(report: dict) -> str:
    if not report:
        return "nothing to kill"
    parts = ["%d process(es) signalled" % len(report.get("sigterm", []))]
    if report.get("killed"):
        parts.append("%d needed SIGKILL" % len(report["killed"]))
    if report.get("dstate"):
        parts.append("HOST NEEDS ATTENTION: %s stuck in uninterruptible sleep"
                     % report["dstate"])
    elif report.get("left"):
        parts.append("LEFT RUNNING: %s" % report["left"])
    else:
        parts.append("none left")
    gpu = report.get("gpu")
    if gpu is not None:
        if gpu.get("held"):
            parts.append("GPU MEMORY STILL HELD: %s by %s" % (human_bytes(gpu["held"]),
                                                              gpu.get("pids")))
        else:
            parts.append("GPU memory freed")
    return ", ".join(parts)


def raw_bytes(batch: LineBatch) -> bytes:
    """The exact bytes a batch carried (log text is surrogate-escaped, see agent/protocol.py)."""
    return text_to_bytes(batch.text)
