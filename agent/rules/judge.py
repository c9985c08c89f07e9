"""The run's rules, one copy: the judge applies them, and so does a console with no judge
(plain data, no I/O, no threads).

The judge (agent/judge/judge.py) feeds a RunView (agent/rules/judge_view.py) with what each node's
supervisor forwards of its journal and of its state.json; these functions read it and say
what happened. A console with no judge (an older agent, or the judge gone) applies the same
functions to its own RunState, shown to them as a view (console/judgement/local_judge.py), so
a run is judged the same with a judge or without (docs/DESIGN-NOTES.md, "One judgement"):

* :func:`check_stalls`: a rank that printed steps stalls after no step for longer than its
  threshold (the run's ``stall_after``, or 5x its median step time); a rank that prints no
  steps stalls with the run's newest stepping rank (:func:`step_stalls`); in a run where no
  rank prints steps, every rank whose CPU has advanced stalls once no rank's has for that long
  (:func:`cpu_stalls`; agent/rules/rankcpu.py, from the nodes' samples); a step, or in such
  a run a rank's CPU advancing, brings each back;
* :func:`check_waiting`: a rendezvous waited in for longer than ``stall_after``, and the
  nodes it waits for (agent/rules/rendezvous.py, from each node's torchrun phase in its state.json);
* :func:`cordon_proposal`: a node in trouble again (a verdict names it, a worker of it fails,
  it ends failed) within ``cordon_within_s`` of rankdeck restarting it is proposed for cordon,
  and (:func:`gpu_proposal`) a node whose GPU reports an Xid or uncorrectable ECC error
  (``--auto-cordon`` acts on the proposal: agent/judge/cordon.py);
* :func:`ends_due`: nodes whose torchrun waits for something that cannot come (a worker that
  failed after the run's last step while the other nodes had finished; an exit barrier
  waiting for nodes that ended otherwise) and how each should end;
* :func:`run_over`: how the run ended, once every node has;
* :func:`verdict_again_due`: when to ask again who is stuck while a stall lasts;
* stragglers, continuously, from the nodes' periodic samples (agent/rules/straggler.py, as the
  RunView takes each sample).

Times are the judge's own clock (when a record arrived), never a host's: nodes' clocks differ.
Standard library only; Python >= 3.9.
"""

import signal
import statistics

from . import rankcpu, rendezvous
from .kinds import whole

STALL_FACTOR = 5.0
VERDICT_AGAIN_S = 10.0
VERDICT_AGAIN_MAX_S = 120.0
ENDED = ("exited", "failed", "stopped")
CORDON_WITHIN_S = 600.0  # trouble again this soon after a restart: the node, not bad luck
# Xids a job causes itself, no fault of the node (NVIDIA's Xid catalog): 13 graphics engine
# exception, 31 memory page fault, 43 the job stopped, 45 preemptive cleanup (a killed GPU
# process: every fence has one), 68 video processor exception
JOB_XIDS = (13, 31, 43, 45, 68)
# what this judge applies, in its `judge` event: a console applies itself what is not listed
# (console/judgement/local_judge.py beside_judge: a judge older than these rules)
RULES = ("stalls", "cpu", "waiting", "verdict", "finish", "stragglers", "cordon")
# what every judge applied, also one older than the `rules` list in its `judge` event
FIRST_RULES = ("stalls", "verdict", "finish")


def event(what, node, rank=None, **fields):
    out = {"k": "event", "what": what, "node": node}
    if rank is not None:
        out["rank"] = rank
    out.update(fields)
    return out


def nan_loss(meta, streak):
    """``(diverged, streak)`` for a ``metric`` record of a rank whose ``streak`` records in a
    row before it had a loss that was inf or NaN: a rank diverges at a non-finite loss in a
    record with the trainer's step, or at the second non-finite loss in a row of records
    without one (a loop that prints no step, a Hugging Face worker with no bar). A lone
    ``loss=nan`` with no step is printed text (a generated sample, a dataset row), not a
    metric line; a line of another family than its file's trainer never reaches here with
    its loss (agent/formats/metrics.py). The console's rule is the same
    (console/model/ranks.py)."""
    loss = meta.get("loss")
    if not isinstance(loss, float) or isinstance(loss, bool):
        return False, streak
    if loss == loss and loss not in (float("inf"), float("-inf")):
        return False, 0
    streak += 1
    return whole(meta.get("step")) or streak >= 2, streak


def stall_threshold(rs, minimum):
    if rs.step_times:
        return max(minimum, STALL_FACTOR * statistics.median(rs.step_times))
    return minimum


def check_stalls(view, now):
    """Mark ranks with no progress for longer than their threshold ``stalled``; the events
    (the ``stalls`` rule, :func:`step_stalls`, and the ``cpu`` rule, :func:`cpu_stalls`)."""
    return step_stalls(view, now) + cpu_stalls(view, now)


def step_stalls(view, now):
    """A rank that printed steps stalls after no step for longer than its threshold; a rank
    that prints no steps stalls with the run's newest stepping rank. Ranks of ended nodes
    do not stall."""
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


def cpu_stalls(view, now):
    """A run where no rank prints steps: every rank whose CPU has advanced stalls once no
    rank's has for longer than ``stall_after`` (agent/rules/rankcpu.py says why not one alone)."""
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
    throwing errors, a flaky NIC): issue 28's cordon policy acts on the proposal. A node
    whose host is flagged (incidents in 2 of its last 5 runs: agent/rules/fleet.py) is
    proposed on its first trouble of this run, restarted or not."""
    ns = view.nodes.get(node)
    if ns is not None and ns.flagged and not ns.flag_proposed and view.cordon_within_s:
        ns.flag_proposed = True
        ns.proposed_at = ns.restarted_at
        return [event("cordon proposed", node, reason=trouble, flagged=True,
                      text="%s proposed for cordon: %s, its first trouble in this run; its "
                      "host is flagged (incidents in 2 of its last 5 runs)" % (node, trouble))]
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
    ``gpu_error`` event of the node's supervisor, agent/host/stats.py), once per GPU and error;
    not for the Xids a job causes itself (JOB_XIDS), nor with proposals off."""
    ns = view.nodes.get(node)
    if ns is None or not view.cordon_within_s or not isinstance(error, str) or \
            not whole(gpu) or error in ("Xid %d" % x for x in JOB_XIDS) or \
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


def stall_began(view, news):
    """A stall began with ``news`` (this tick's events): ranks stalled just now and no rank
    before them. A rank the stall reaches later (a hung rank's peers stall a tick or two after
    it, or after the verdict) is the same stall: one verdict (:func:`verdict_again_due` looks
    again while it names nobody)."""
    now_stalled = {e["rank"] for e in news if e["what"] == "stalled"}
    return bool(now_stalled) and set(stalled(view)) <= now_stalled


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


def ends_due(view, by="the judge"):
    """``{node: {"state", "cause", "text"}}``: live nodes to stop and how each ends; ``by``:
    who stops them, in the cause (a console with no judge: ``rankdeck``)."""
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
                       "torchrun restarted it into a run that was over, so %s stopped %s"
                       % (rank, how, step, by, ns.name), "rank": rank},
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
# same from squeue: console/slurm/slurm.py)
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
    for ns in view.nodes.values():  # its Slurm job ended under it (agent/slurm/job.py)
        cause = ns.cause if isinstance(ns.cause, dict) else {}
        if cause.get("slurm") in SLURM_ENDS and isinstance(cause.get("message"), str):
            return SLURM_ENDS[cause["slurm"]], {"node": ns.name, "message": cause["message"]}
    return "stopped", None
