"""Runs that finished must end: nodes whose torchrun waits for something that cannot come.

Most Hugging Face Trainer scripts never call ``destroy_process_group``. Once, rank 0 aborted
in its interpreter's teardown (SIGABRT) after its last step; its torchrun, with restarts left,
restarted the worker into a rendezvous no peer would ever join (the other nodes had finished),
and the run hung as `running` until stopped by hand. Meanwhile the other nodes' torchruns sat
in their exit barrier (up to 300 s) waiting for that node's.

:func:`ends_due` reads RunState and says which live nodes to stop and how each should end:

* a node whose worker failed (``worker_failed``, agent/torchrun/worker_exit.py) after it had reached
  the run's last step, while every other node's workers had finished (node ``exited``, or
  torchrun's phase ``finished``): ``failed``, with a cause naming the rank and the signal;
* a node whose workers finished and whose torchrun can only wait in its exit barrier for
  nodes that ended otherwise (failed, stopped, or ending by the rule above): ``exited``.

The RunController stops each such node once, through ``stop`` with ``end`` (docs/PROTOCOL.md),
so that the node's own journal says how it ended and any later console replays the same.
"""

from __future__ import annotations

from agent.rules.judge import how_it_ended

from ..model.state import RunState
from ..model.nodes import NodeState


def workers_finished(ns: NodeState) -> bool:
    """Every worker of the node's torchrun is done: it exited 0, or waits for the others."""
    return ns.state == "exited" or (not ns.ended and (ns.phase or {}).get("name") == "finished")


def ends_due(state: RunState) -> dict[str, dict]:
    """``{node: {"state", "cause", "say"}}`` for each live node to stop, and how it ends."""
    finished = {ns.name for ns in state.nodes.values() if workers_finished(ns)}
    out = {}
    for ns in state.nodes.values():
        end = _restarted_after_finish(state, ns, finished)
        if end is not None:
            out[ns.name] = end
    out.update(_waiting_in_exit_barrier(state, finished, out))
    return out


def _restarted_after_finish(state: RunState, ns: NodeState, finished: set) -> dict | None:
    failure = ns.worker_failure
    others = [n for n in state.nodes if n != ns.name]
    if ns.ended or ns.name in finished or failure is None or not others \
            or not all(n in finished for n in others):
        return None
    rank = failure.get("rank")
    rs = state.ranks.get(rank) if rank is not None else None
    last = max((r.step for r in state.ranks.values() if r.step is not None), default=None)
    if rs is not None and rs.step is not None and last is not None and rs.step < last:
        return None  # it failed before the end: not this case
    step = " (step %s)" % rs.step if rs is not None and rs.step is not None else ""
    how = how_it_ended(failure.get("exit_code"))
    message = ("rank %s %s after its last step%s, while the other nodes had finished; "
               "torchrun restarted it into a run that was over, so rankdeck stopped %s"
               % (rank, how, step, ns.name))
    return {"state": "failed", "cause": {"message": message, "rank": rank},
            "say": "rank %s %s after its last step%s and the other nodes have finished: "
                   "stopping %s, whose torchrun restarted it into a run that is over"
                   % (rank, how, step, ns.name)}


def _waiting_in_exit_barrier(state: RunState, finished: set, ending: dict) -> dict:
    waiting = [ns for ns in state.nodes.values() if not ns.ended and ns.name in finished]
    blockers = [ns for ns in state.nodes.values() if ns.name not in finished]
    if not waiting or not blockers or not all(ns.ended or ns.name in ending for ns in blockers):
        return {}
    names = ", ".join(ns.name for ns in blockers)
    return {ns.name: {"state": "exited", "cause": None,
                      "say": "its workers finished; stopping its torchrun, which waits in its "
                             "exit barrier for %s, which will not come" % names}
            for ns in waiting}
