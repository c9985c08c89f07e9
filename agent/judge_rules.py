"""What the run's judge knows and the rules it applies (plain data, no I/O, no threads).

The judge (agent/judge.py) feeds a :class:`RunView` with what each node's supervisor forwards
of its journal (the records' metas: files and their ranks, metrics, events) and of its
state.json; these functions read it and say what happened. They are the console's rules
(console/liveness.py, console/finish.py) over the judge's smaller view, so a run with no console
attached is judged as an attached console judges it:

* :func:`check_stalls`: a rank that printed steps stalls after no step for longer than its
  threshold (the run's ``stall_after``, or 5x its median step time); a rank that prints no
  steps stalls with the run's newest stepping rank; in a run where no rank prints steps, every
  rank stalls once no rank's CPU has advanced for that long (agent/rankcpu.py, from the
  nodes' samples); a step, or in such a run a rank's CPU advancing, brings each back;
* :func:`check_waiting`: a rendezvous waited in for longer than ``stall_after``, and the
  nodes it waits for (agent/rendezvous.py, from each node's torchrun phase in its state.json);
* :func:`cordon_proposal`: a node in trouble again (a verdict names it, a worker of it fails,
  it ends failed) within ``cordon_within_s`` of rankdeck restarting it is proposed for cordon,
  and (:func:`gpu_proposal`) a node whose GPU reports an Xid or uncorrectable ECC error
  (``--auto-cordon`` acts on the proposal: agent/judge_cordon.py);
* :func:`ends_due`: nodes whose torchrun waits for something that cannot come (a worker that
  failed after the run's last step while the other nodes had finished; an exit barrier
  waiting for nodes that ended otherwise) and how each should end;
* :func:`run_over`: how the run ended, once every node has;
* :func:`verdict_again_due`: when to ask again who is stuck while a stall lasts;
* stragglers, continuously, from the nodes' periodic samples (agent/straggler.py).

Times are the judge's own clock (when a record arrived), never a host's: nodes' clocks differ.
Over 450 lines: the rules share one view of the run (``RunView``) and its node and rank
views; split, that view would travel between modules. Standard library only; Python >= 3.9.
"""

import signal
import statistics
from collections import deque

from . import rankcpu, rendezvous
from .straggler import Stragglers

STALL_FACTOR = 5.0
VERDICT_AGAIN_S = 10.0
VERDICT_AGAIN_MAX_S = 120.0
ENDED = ("exited", "failed", "stopped")
CORDON_WITHIN_S = 600.0  # trouble again this soon after a restart: the node, not bad luck
# Xids a job causes itself, no fault of the node (NVIDIA's Xid catalog): 13 graphics engine
# exception, 31 memory page fault, 43 the job stopped, 45 preemptive cleanup (a killed GPU
# process: every fence has one), 68 video processor exception
JOB_XIDS = (13, 31, 43, 45, 68)
CASCADE_S = 30.0  # a worker failure this soon after another node's failure or restart is its echo
# what this judge applies, in its `judge` event: a console applies itself what is not listed
# (console/liveness.py beside_judge: a judge older than these rules)
RULES = ("stalls", "cpu", "waiting", "verdict", "finish", "stragglers", "cordon")


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
        self.busy = False  # its worker's CPU has advanced (a rank that prints no steps)


class NodeView:
    def __init__(self, name):
        self.name = name
        self.state = "starting"
        self.phase = None
        self.worker_failure = None
        self.cause = None
        self.connected = False
        self.restarting = False  # rankdeck restarts it: between `restarting` and `launched`
        self.restarted_at = None  # judge time its torchrun started again after that restart
        self.proposed_at = None  # restarted_at of the restart its cordon was proposed after
        self.gpu_proposed = set()  # (gpu, error) its cordon was proposed for

    @property
    def ended(self):
        return self.state in ENDED


class RunView:
    """Nodes, ranks and the verdict's timing, as the judge has heard of them."""

    def __init__(self, nodes, stall_after, cordon_within_s=CORDON_WITHIN_S):
        self.nodes = {name: NodeView(name) for name in nodes}
        self.cordon_within_s = float(cordon_within_s or 0)  # 0: no proposals
        self.ranks = {}
        self.files = {}  # (node, fid) -> rank
        self.stall_after = float(stall_after)
        self.verdict = None
        self.verdict_at = float("-inf")
        self.verdict_tries = 0
        self.world = None  # the world size the nodes' files say
        self.stragglers = Stragglers()  # from the supervisors' samples (agent/straggler.py)
        self.rank_cpu = rankcpu.RankCpu()  # the same samples: silent ranks' CPU
        self.waiting = None  # the rendezvous waited in too long (agent/rendezvous.py)
        self.disrupted = None  # (node, when) of the run's last worker failure or restart

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
        ``diverged`` at a rank's first non-finite loss, ``cordon proposed``) as dicts."""
        kind = meta.get("k")
        if kind == "sample":
            return self._sampled(node, meta, now) if node in self.nodes else []
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
                # a failure that follows another node's within CASCADE_S is most likely that
                # one's echo (its peers' collectives fail with it): no trouble of this node
                echo = self.disrupted is not None and self.disrupted[0] != node \
                    and now - self.disrupted[1] <= CASCADE_S
                self.disrupted = (node, now)
                return [] if echo else cordon_proposal(self, node, "rank %s %s" % (
                    meta.get("rank"), how_it_ended(meta.get("exit_code"))), now)
            if what == "gpu_error":
                return gpu_proposal(self, node, meta.get("gpu"), meta.get("error"))
            if what == "restarting":
                ns.restarting = True
                self.disrupted = (node, now)
            elif what == "launched":
                ns.worker_failure = None
                if ns.restarting:
                    ns.restarting, ns.restarted_at = False, now
        return []

    def _sampled(self, node, meta, now):
        """A node's periodic sample: stragglers; whose CPU advanced, and in a run where no
        rank prints steps, the stalled ranks run again when one's does."""
        out = [event(what, self.ranks[r].node if r in self.ranks else node, r, text=text)
               for r, what, text in self.stragglers.add(meta, self.world)]
        moved = [r for r in self.rank_cpu.add(meta, at=now) if r in self.ranks]
        for r in moved:
            self.ranks[r].busy = True
        if moved and not any(rs.reports for rs in self.ranks.values()):
            for rs in self.ranks.values():
                if rs.state == "stalled":
                    rs.state = "running"
                    out.append(event("stepping", rs.node, rs.rank, text="rank %d %s"
                                     % (rs.rank, rankcpu.AGAIN_TEXT)))
        return out

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

    def apply_state(self, node, st, now=None, stopping=()):
        """A node's state.json: its state, phase and cause; its ranks end with it. ``now``:
        the judge's time, into which the phase's ``since`` is moved (``st["sent"]``: the
        host's clock when its link read the file); without it the host's own. Returns a
        cordon proposal when the node just ended failed, unless it is in ``stopping`` (the
        judge ended it)."""
        ns = self.nodes.get(node)
        if ns is None or not isinstance(st, dict):
            return []
        was = ns.state
        ns.state = st.get("state") if isinstance(st.get("state"), str) else ns.state
        ns.phase = _phase_in(rendezvous.phase_of(st.get("phase")), ns.phase, st.get("sent"), now)
        ns.cause = st.get("cause") if isinstance(st.get("cause"), dict) else None
        if ns.ended:
            for rs in self.ranks.values():
                if rs.node == node:
                    rs.state = ns.state
        if ns.state != "failed" or was == "failed" or node in stopping or now is None:
            return []
        cause = (ns.cause or {}).get("message")
        return cordon_proposal(self, node, "it ended failed%s" % (
            ": %s" % cause if isinstance(cause, str) else ""), now)

    def alive_ranks(self):
        """rank -> node for every rank the run expects to answer (its node not ended)."""
        return {r: rs.node for r, rs in self.ranks.items()
                if rs.state in ("running", "stalled") and not self.nodes[rs.node].ended}


def _phase_in(phase, before, sent, now):
    """``phase`` with ``since`` in the judge's clock: as long ago as the host says, when it
    says when it sent it; else when the judge first heard of this phase."""
    if phase is None or now is None:
        return phase
    host_since = phase["since"]
    if host_since is not None and isinstance(sent, (int, float)) and not isinstance(sent, bool) \
            and abs(sent) < rendezvous.MOST:
        phase["since"] = now - max(0.0, sent - host_since)
    elif before is not None and all(before.get(k) == phase.get(k)
                                    for k in ("name", "round", "note")):
        phase["since"] = before["since"]
    else:
        phase["since"] = now
    return phase


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
    return out + _cpu_stalls(view, now)


def _cpu_stalls(view, now):
    """A run where no rank prints steps: every rank whose CPU has advanced stalls once no
    rank's has for longer than ``stall_after`` (agent/rankcpu.py says why not one alone)."""
    idle = rankcpu.silent_run_idle_s(view.ranks, view.rank_cpu, view.stall_after)
    if idle is None:
        return []
    out = []
    for rs in view.ranks.values():
        if rs.state == "running" and rs.busy and not view.nodes[rs.node].ended:
            rs.state = "stalled"
            out.append(event("stalled", rs.node, rs.rank, idle_s=round(idle, 1),
                             text=rankcpu.stall_text(rs.rank, idle)))
    return out


def check_waiting(view, now):
    """The rendezvous waited in for longer than ``stall_after`` (no step for that long either
    way): a ``waiting`` event naming the nodes it waits for, once per round and set of nodes
    missing, and ``waiting over`` when it no longer waits; kept in ``view.waiting``."""
    wait = rendezvous.waiting(view.nodes, list(view.ranks.values()), now, view.stall_after)
    out = []
    if wait and (view.waiting is None or rendezvous.wait_key(wait)
                 != rendezvous.wait_key(view.waiting)):
        out.append(event("waiting", None, round=wait["round"], joined=wait["joined"],
                         nodes=wait["nodes"], missing=wait["missing"], waited_s=round(
                             now - wait["since"], 1), text=wait["text"], **{"in": wait["in"]}))
    elif wait is None and view.waiting is not None:
        rnd = view.waiting["round"]
        out.append(event("waiting over", None, round=rnd, text="the rendezvous%s waits no "
                         "more" % ("" if rnd is None else " (round %d)" % rnd)))
    view.waiting = wait
    return out


def verdict_proposals(view, verdict, now):
    """Cordon proposals for the nodes a verdict on a stall names (a hang again)."""
    return [ev for s in verdict.get("suspects") or [] if isinstance(s, dict)
            for ev in cordon_proposal(view, s.get("node"), "the verdict names rank %s (%s)"
                                      % (s.get("rank"), verdict.get("kind")), now)]


def cordon_proposal(view, node, trouble, now):
    """``[a "cordon proposed" event]`` when ``node`` is in ``trouble`` (words: what happened)
    within ``view.cordon_within_s`` of rankdeck restarting it, once per restart; else []. A
    node in trouble again soon after its restart is likely bad rather than unlucky (a GPU
    throwing errors, a flaky NIC): issue 28's cordon policy acts on the proposal."""
    ns = view.nodes.get(node)
    if ns is None or ns.restarted_at is None or not view.cordon_within_s \
            or ns.proposed_at == ns.restarted_at:
        return []
    since = now - ns.restarted_at
    if since > view.cordon_within_s:
        return []
    ns.proposed_at = ns.restarted_at
    return [event("cordon proposed", node, reason=trouble, since_restart_s=round(since, 1),
                  within_s=view.cordon_within_s,
                  text="%s proposed for cordon: %s %.0f s after it was restarted (within %.0f s)"
                  % (node, trouble, since, view.cordon_within_s))]


def gpu_proposal(view, node, gpu, error):
    """``[a "cordon proposed" event]`` for a GPU's Xid or uncorrectable ECC error (a
    ``gpu_error`` event of the node's supervisor, agent/hoststats.py), once per GPU and error;
    not for the Xids a job causes itself (JOB_XIDS), nor with proposals off."""
    ns = view.nodes.get(node)
    if ns is None or not view.cordon_within_s or not isinstance(error, str) or \
            not _whole(gpu) or error in ("Xid %d" % x for x in JOB_XIDS) or \
            (gpu, error) in ns.gpu_proposed:
        return []
    ns.gpu_proposed.add((gpu, error))
    return [event("cordon proposed", node, reason="GPU %d reported %s" % (gpu, error[:80]),
                  gpu=gpu, error=error[:80],
                  text="%s proposed for cordon: GPU %d reported %s" % (node, gpu, error[:80]))]


def stalled(view):
    return sorted(r for r, rs in view.ranks.items() if rs.state == "stalled")


def all_stalled(ranks):
    """Every one of ``ranks`` stalled (at least one): a node's, then nothing of it can save;
    the run's, then a hung run, whose other nodes' workers wait in a collective for the hung
    node's (a cordon kills them: ``drop_workers``, the console's and the judge's alike)."""
    ranks = list(ranks)
    return bool(ranks) and all(r.state == "stalled" for r in ranks)


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


# a run whose Slurm job was cancelled, preempted or timed out ends so (``status`` says the
# same from squeue: console/slurm.py)
SLURM_ENDS = {"CANCELLED": "cancelled", "PREEMPTED": "cancelled", "TIMEOUT": "timeout"}


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
    for ns in view.nodes.values():  # its Slurm job ended under it (agent/slurm_job.py)
        cause = ns.cause if isinstance(ns.cause, dict) else {}
        if cause.get("slurm") in SLURM_ENDS and isinstance(cause.get("message"), str):
            return SLURM_ENDS[cause["slurm"]], {"node": ns.name, "message": cause["message"]}
    return "stopped", None
