"""RunState: what the console knows about a run, as plain data. No asyncio, no Textual.

Records in, plain data out: the RunController feeds it journal records and supervisor
states from every node (``apply_records``, ``apply_supervisor_state``: the reducer, in
console/model/apply.py and console/model/ranks.py); the headless printer and the TUI read it
and subscribe to :class:`~console.model.nodes.LineBatch` callbacks. Its nodes, ranks, files
and events are console/model/nodes.py's records. What time alone changes (stalls, a
rendezvous that waits, asking again who is stuck) is ruled by the judge's rules
(agent/rules/judge.py), applied here by console/judgement/local_judge.py when the run has no
judge. Every buffer is bounded (lines and loss points per rank in console/model/buffers.py, events here).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable

from . import health, ownership, rendezvous, apply as state_apply
from .buffers import BUDGET_MB, Kept, LineBudget
from .checkpoints import Checkpoints
from .consoles import Operators
from ..lines.sanitize import NO_SECRETS, Masker, clean
from agent.rules.goodput import Goodput
from agent.rules.rankcpu import RankCpu
from agent.rules.straggler import Stragglers
from .nodes import ENDED, LINES_PER_NODE, LINES_PER_RANK, Event, LineBatch, NodeState, RankState
from .telemetry import hardware_events, hardware_of, node_row

EVENTS = 2000
STALL_MIN_S = 60.0  # --stall-after's default (the rules: agent/rules/judge.py)

RUN_ENDED = ("succeeded", "failed", "stopped", "gone")  # a run's end states (RunState.run_state)


def ended_run_state(states) -> str | None:
    """How a run whose active nodes are in ``states`` ended (one of RUN_ENDED), or None while
    one of them lives. A node whose supervisor died without an end (`lost`: killed, the host
    rebooted, a Slurm step's cgroup ended under it) runs no more: with every other node ended,
    the run failed. Nor does a node nothing of which is left (`gone`: no state, no process):
    with no live node the run is not running, and how it ended is not known."""
    if not all(s in ENDED or s in ("lost", "gone") for s in states):
        return None
    if all(s == "exited" for s in states):
        return "succeeded"
    if any(s in ("failed", "lost") for s in states):
        return "failed"
    return "gone" if "gone" in states else "stopped"


class RunState:
    """Everything known about one run; fed by the controller, read by the views."""

    def __init__(self, run_id: str, nodes: list[tuple[str, str]], max_restarts: int = 0,
                 stall_min_s: float = STALL_MIN_S, lines_per_rank: int = LINES_PER_RANK,
                 line_budget: int = BUDGET_MB << 20, slots: dict[str, int] | None = None):
        self.run_id = run_id
        # hosts flagged by their record (agent/rules/fleet.py): the nodes table marks them
        self.flagged_hosts: set[str] = set()
        self.lines_per_rank = lines_per_rank  # older lines are fetched from the nodes on demand
        self.budget = LineBudget(line_budget)  # for all kept lines: memory by budget, not rank
        self.nodes: dict[str, NodeState] = {
            name: NodeState(name=name, addr=addr, max_restarts=max_restarts,
                            lines=Kept(LINES_PER_NODE, self.budget),
                            slots=(slots or {}).get(name, ownership.DEFAULT_SLOTS))
            for name, addr in nodes
        }
        self.nproc: int | None = None  # the launch's --nproc-per-node, when it has one
        # what starts each node (console/launch/launchers.py): torchrun, deepspeed, accelerate, or
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
        self.waiting: dict | None = None  # the rendezvous waited in too long (agent/rules/judge.py check_waiting)
        # a Slurm run's job now (console/slurm/slurm.py job_now), ``at`` when asked: the header's
        # time left
        self.slurm: dict | None = None
        # the run's secrets: masked in every line, event text and cause as they come in
        self.masker: Masker = NO_SECRETS
        self.checkpoints = Checkpoints()
        self.ran = False  # a rank has stepped: the run is never `starting` again
        self.silent_waiting: set[int] = set()  # silent ranks the run's next step wakes
        self.verdict: dict | None = None  # who is stuck (agent/rules/verdict.py), while stalled
        self.verdict_at = 0.0  # when it was taken
        self.verdict_tries = 0  # looks again at an unknown verdict (agent/rules/judge.py)
        self.judge: dict | None = None  # the judge on the hosts, its settings (console/judgement/judged.py)
        self.judge_offset = 0  # in the judge's journal
        self.stall_min_given = False  # `--stall-after` given to this console: it wins
        self.judge_stalled: set[int] = set()  # ranks the judge says are stalled
        # surgeries the judge did itself (--auto-cordon): {who, what, when, node, spare,
        # outcome, left, gpu}; console/surgery/cordon.py follow_judge keeps them in the run record
        self.judge_surgeries: list[dict] = []
        self.stragglers = Stragglers()  # from the supervisors' samples (agent/supervisor/ranksample.py)
        self.rank_cpu = RankCpu()  # silent ranks' CPU, from the same samples
        self.operators = Operators()  # consoles attached, the action log (console/model/consoles.py)
        # where the run's time went, from every journal's records (agent/rules/goodput.py)
        self.goodput = Goodput()

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
        agent's again from its next record. A cordoned node's ranks go (console/model/ranks.py:
        it claims none from then on): none of them is listed stale beside the new world."""
        ns = self.nodes[node]
        ns.role = role
        ns.state = role if role != "active" else "starting"
        if role == "cordoned":  # its ranks leave the run, as they leave the judge's view
            for rank in [r for r, rs in self.ranks.items() if rs.node == node]:
                del self.ranks[rank]
                self.silent_waiting.discard(rank)
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

    def set_health(self, node: str, entry) -> None:
        """``node``'s deep preflight result (console/model/health.py ``checked``)."""
        self.nodes[node].health = health.checked(entry)
        self.changed(node)

    def set_node(self, node: str, state: str, cause: str | None = None) -> None:
        ns = self.nodes[node]
        cause = clean(cause, self.masker) if cause else cause  # often a host's text
        if ns.state != state or ns.cause != cause:
            ns.state, ns.cause = state, cause
            self.changed(node)

    def apply_records(self, node: str, recs: list, end: int) -> None:
        """Journal records from a node's agent (the ``recs`` of a ``journal`` message):
        console/model/apply.py applies them."""
        state_apply.apply_records(self, node, recs, end)

    def apply_supervisor_state(self, node: str, st: dict | None) -> None:
        """A node's state.json (from a ``state`` message): console/model/apply.py."""
        state_apply.apply_supervisor_state(self, node, st)

    # -- reading ---------------------------------------------------------------------------
    def run_state(self) -> str:
        ended = ended_run_state([n.state for n in self.nodes.values() if n.role == "active"])
        if ended:
            return ended
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
                "phase": rendezvous.shown_phase(ns),
                "health": ns.health,
            })
        return {"run_id": self.run_id, "state": self.run_state(), "launcher": self.launcher,
                "nodes": nodes,
                "started": self.started, "events": len(self.events),
                "world_size": self.world_size, "checkpoints": self.checkpoints.status(),
                "resumed_from": self.checkpoints.resumed_status(),
                "waiting_for": self.waiting, "verdict": self.verdict,
                "goodput": self.goodput.report(now)}
