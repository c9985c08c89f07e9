"""What the run's judge knows and the rules it applies (plain data, no I/O, no threads).

The judge (agent/judge.py) feeds a :class:`RunView` with what each node's supervisor forwards
of its journal (the records' metas: files and their ranks, metrics, events) and of its
state.json; these functions read it and say what happened. They are the console's rules
(console/liveness.py, console/finish.py) over the judge's smaller view, so a run with no console
attached is judged as an attached console judges it:

* :func:`check_stalls`: a rank that printed steps stalls after no step for longer than its
  threshold (the run's ``stall_after``, or 5x its median step time); a rank that prints no
  steps stalls with the run's newest stepping rank; a step brings each back;
* :func:`ends_due`: nodes whose torchrun waits for something that cannot come (a worker that
  failed after the run's last step while the other nodes had finished; an exit barrier
  waiting for nodes that ended otherwise) and how each should end;
* :func:`run_over`: how the run ended, once every node has;
* :func:`verdict_again_due`: when to ask again who is stuck while a stall lasts;
* stragglers, continuously, from the nodes' periodic samples (agent/straggler.py).

Times are the judge's own clock (when a record arrived), never a host's: nodes' clocks differ.
Standard library only; Python >= 3.9.
"""

import signal
import statistics
from collections import deque

from .straggler import Stragglers

STALL_FACTOR = 5.0
VERDICT_AGAIN_S = 10.0
VERDICT_AGAIN_MAX_S = 120.0
ENDED = ("exited", "failed", "stopped")


class RankView:
    def __init__(self, rank, node):
        self.rank = rank
        self.node = node
        self.state = "running"
        self.step = None
        self.last_progress = None  # judge time of its last step
        self.reports = False  # it has printed a step
        self.step_times = deque(maxlen=64)
        self.diverged = None  # the step of its first non-finite loss


class NodeView:
    def __init__(self, name):
        self.name = name
        self.state = "starting"
        self.phase = None
        self.worker_failure = None
        self.cause = None
        self.connected = False

    @property
    def ended(self):
        return self.state in ENDED


class RunView:
    """Nodes, ranks and the verdict's timing, as the judge has heard of them."""

    def __init__(self, nodes, stall_after):
        self.nodes = {name: NodeView(name) for name in nodes}
        self.ranks = {}
        self.files = {}  # (node, fid) -> rank
        self.stall_after = float(stall_after)
        self.verdict = None
        self.verdict_at = float("-inf")
        self.verdict_tries = 0
        self.world = None  # the world size the nodes' files say
        self.stragglers = Stragglers()  # from the supervisors' samples (agent/straggler.py)

    def cordon(self, out, into=None):
        """Node surgery (docs/SURGERY.md): ``out`` leaves the run with its ranks and files (no
        rule waits for it, the run's end does not count it); ``into`` (a spare) joins it."""
        self.nodes.pop(out, None)
        for rank in [r for r, rs in self.ranks.items() if rs.node == out]:
            del self.ranks[rank]
        for key in [k for k in self.files if k[0] == out]:
            del self.files[key]
        if into and into not in self.nodes:
            self.nodes[into] = NodeView(into)

    # -- what a node forwards --------------------------------------------------------------
    def apply(self, node, meta, now):
        """One forwarded journal meta; the events it causes (``stepping`` after a stall,
        ``diverged`` at a rank's first non-finite loss) as dicts."""
        kind = meta.get("k")
        if kind == "sample":
            return [event(what, self.ranks[r].node if r in self.ranks else node, r, text=text)
                    for r, what, text in self.stragglers.add(meta, self.world)]
        if kind == "file" and node not in self.nodes:
            return []  # a cordoned node's last records: it is out of the run
        if kind == "file" and _whole(meta.get("rank")) and _whole(meta.get("f")):
            rank = meta["rank"]
            if _whole(meta.get("world_size")) and 0 < meta["world_size"] <= 1 << 20:
                self.world = meta["world_size"]
            self.files[(node, meta["f"])] = rank
            rs = self.ranks.get(rank)
            if rs is None or rs.node != node or rs.state in ENDED:
                rs = self.ranks[rank] = RankView(rank, node)
            return []
        if kind == "metric":
            rank = self.files.get((node, meta.get("f")))
            rs = self.ranks.get(rank)
            if rs is None:
                return []
            return self._stepped(rs, meta, now)
        if kind == "event":
            what = meta.get("what")
            ns = self.nodes.get(node)
            if ns is None:
                return []
            if what == "worker_failed":
                ns.worker_failure = {"rank": meta.get("rank"), "exit_code": meta.get("exit_code")}
            elif what == "launched":
                ns.worker_failure = None
        return []

    def _stepped(self, rs, meta, now):
        out = []
        loss = meta.get("loss")
        step = meta.get("step")
        if isinstance(loss, float) and loss != loss or loss in (float("inf"), float("-inf")):
            if rs.diverged is None:
                rs.diverged = step if step is not None else rs.step
                out.append(event("diverged", rs.node, rs.rank, step=rs.diverged,
                                 text="rank %d diverged: loss %s at step %s"
                                 % (rs.rank, loss, rs.diverged)))
        if step is None:
            return out
        rs.step = step
        if isinstance(meta.get("step_time"), (int, float)):
            rs.step_times.append(meta["step_time"])
        rs.last_progress = now
        rs.reports = True
        for other in self.ranks.values():
            if other.state == "stalled" and (other is rs or not other.reports):
                other.state = "running"
                out.append(event("stepping", other.node, other.rank, step=step,
                                 text="rank %d stepping again (step %s)" % (other.rank, step)))
        return out

    def apply_state(self, node, st):
        """A node's state.json: its state, phase and cause; its ranks end with it."""
        ns = self.nodes.get(node)
        if ns is None or not isinstance(st, dict):
            return
        ns.state = st.get("state") if isinstance(st.get("state"), str) else ns.state
        ns.phase = st.get("phase") if isinstance(st.get("phase"), dict) else None
        ns.cause = st.get("cause") if isinstance(st.get("cause"), dict) else None
        if ns.ended:
            for rs in self.ranks.values():
                if rs.node == node:
                    rs.state = ns.state

    def alive_ranks(self):
        """rank -> node for every rank the run expects to answer (its node not ended)."""
        return {r: rs.node for r, rs in self.ranks.items()
                if rs.state in ("running", "stalled") and not self.nodes[rs.node].ended}


def event(what, node, rank=None, **fields):
    out = {"k": "event", "what": what, "node": node}
    if rank is not None:
        out["rank"] = rank
    out.update(fields)
    return out


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def stall_threshold(rs, minimum):
    if rs.step_times:
        return max(minimum, STALL_FACTOR * statistics.median(rs.step_times))
    return minimum


def check_stalls(view, now):
    """Mark ranks with no progress for longer than their threshold ``stalled``; the events."""
    out = []
    for rs in view.ranks.values():
        if rs.state != "running" or rs.last_progress is None or view.nodes[rs.node].ended:
            continue
        idle = now - rs.last_progress
        if idle > stall_threshold(rs, view.stall_after):
            rs.state = "stalled"
            out.append(event("stalled", rs.node, rs.rank, step=rs.step, idle_s=round(idle, 1),
                             text="rank %d stalled: no step for %.0f s (last step %s)"
                             % (rs.rank, idle, rs.step)))
    steppers = [r for r in view.ranks.values() if r.last_progress is not None]
    if steppers:
        newest = max(steppers, key=lambda r: r.last_progress)
        idle = now - newest.last_progress
        if idle > stall_threshold(newest, view.stall_after):
            for rs in view.ranks.values():
                if not rs.reports and rs.state == "running" and not view.nodes[rs.node].ended:
                    rs.state = "stalled"
                    out.append(event("stalled", rs.node, rs.rank, step=newest.step,
                                     idle_s=round(idle, 1),
                                     text="rank %d stalled: it prints no steps and the run has "
                                     "made none for %.0f s" % (rs.rank, idle)))
    return out


def stalled(view):
    return sorted(r for r, rs in view.ranks.items() if rs.state == "stalled")


def verdict_again_due(view, now):
    """The stall goes on and the last verdict named nobody: look again, 10 s after the first
    look, doubling up to 120 s."""
    if view.verdict is None or view.verdict.get("kind") != "unknown" or not stalled(view):
        view.verdict_tries = 0
        return False
    wait = min(VERDICT_AGAIN_MAX_S, VERDICT_AGAIN_S * 2 ** view.verdict_tries)
    if now - view.verdict_at < wait:
        return False
    view.verdict_tries += 1
    return True


def how_it_ended(exit_code):
    """``killed by SIGABRT (exit -6)`` or ``exited with code 1``."""
    if isinstance(exit_code, int) and exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = "signal %d" % -exit_code
        return "killed by %s (exit %d)" % (name, exit_code)
    return "exited with code %s" % exit_code


def _finished(ns):
    return ns.state == "exited" or (not ns.ended and (ns.phase or {}).get("name") == "finished")


def ends_due(view):
    """``{node: {"state", "cause", "text"}}``: live nodes to stop and how each ends (the
    console's console/finish.py, over the judge's view)."""
    finished = {n.name for n in view.nodes.values() if _finished(n)}
    out = {}
    last = max((r.step for r in view.ranks.values() if r.step is not None), default=None)
    for ns in view.nodes.values():
        failure = ns.worker_failure
        others = [n for n in view.nodes if n != ns.name]
        if ns.ended or ns.name in finished or failure is None or not others \
                or not all(n in finished for n in others):
            continue
        rank = failure.get("rank")
        rs = view.ranks.get(rank)
        if rs is not None and rs.step is not None and last is not None and rs.step < last:
            continue  # it failed before the end: torchrun's restart is the right thing
        step = " (step %s)" % rs.step if rs is not None and rs.step is not None else ""
        how = how_it_ended(failure.get("exit_code"))
        out[ns.name] = {"state": "failed", "cause": {
            "message": "rank %s %s after its last step%s, while the other nodes had finished; "
                       "torchrun restarted it into a run that was over, so the judge stopped %s"
                       % (rank, how, step, ns.name), "rank": rank},
            "text": "rank %s %s after its last step%s and the other nodes have finished: "
                    "stopping %s" % (rank, how, step, ns.name)}
    waiting = [ns for ns in view.nodes.values() if not ns.ended and ns.name in finished]
    blockers = [ns for ns in view.nodes.values() if ns.name not in finished]
    if waiting and blockers and all(ns.ended or ns.name in out for ns in blockers):
        names = ", ".join(ns.name for ns in blockers)
        for ns in waiting:
            out[ns.name] = {"state": "exited", "cause": None,
                            "text": "%s's workers finished; stopping its torchrun, which waits "
                                    "in its exit barrier for %s" % (ns.name, names)}
    return out


def run_over(view):
    """``(state, cause)`` once every node has ended (``succeeded`` when all exited), else
    None. The cause is the first failed node's."""
    if not view.nodes or not all(ns.ended for ns in view.nodes.values()):
        return None
    states = {ns.state for ns in view.nodes.values()}
    if states == {"exited"}:
        return "succeeded", None
    failed = [ns for ns in view.nodes.values() if ns.state == "failed"]
    if failed:
        cause = failed[0].cause or {}
        message = cause.get("message") if isinstance(cause.get("message"), str) else None
        return "failed", {"node": failed[0].name, "message": message}
    return "stopped", None
