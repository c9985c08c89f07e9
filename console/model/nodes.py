"""The run's records, one per node, rank and followed file, as plain data; and what the views
are handed (:class:`LineBatch`, :class:`Event`). RunState (console/model/state.py) keeps them; the
journal's records change them (console/model/apply.py, console/model/ranks.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .buffers import Kept, Series, StepMarks

LINES_PER_RANK = 5000
LINES_PER_NODE = 2000

ENDED = ("exited", "failed", "stopped")  # a node's end states


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
    claim: int | None = None  # a rank another node still runs: held (console/model/ownership.py)
    pid: int | None = None
    ts: float | None = None


@dataclass
class LineBatch:
    """New bytes of one file of one node, cut at line ends (``lines``); ``text`` is the raw data.

    ``journal`` is where the record starts in the node's journal (None from an agent that does
    not say): with a line's index in ``lines`` it is the line's position, which scrolling back
    asks the node for what came before (console/model/scrollback.py).
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
    nan_streak: int = 0  # its metric records in a row with such a loss (agent/rules/judge.py)
    last_progress: float | None = None
    reports: bool = False  # it has printed a metric; a silent one steps with the run's ranks
    busy: bool = False  # its worker's CPU has advanced (a CPU stall stalls only such ranks)
    started: float | None = None  # when its newest worker's file appeared
    step_times: deque = field(default_factory=lambda: deque(maxlen=64))
    points: Series = field(default_factory=Series)
    lines: Kept = field(default_factory=lambda: Kept(LINES_PER_RANK))
    step_marks: StepMarks = field(default_factory=StepMarks)  # where its steps are in lines

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
    host: dict | None = None  # the agent's host sample (agent/host/stats.py), sent with gpu
    phase: dict | None = None  # its torchrun's phase (console/model/rendezvous.py), from state.json
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
    health: dict | None = None  # its deep preflight's result (console/model/health.py)

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
