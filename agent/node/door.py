"""One door per node operation on the host: a console's request through `serve`
(agent/serve/server.py) and the run's judge through the node's supervisor
(agent/supervisor/judge_link.py) start, stop, restart, fence and unfence a node and drop its
stalled workers with the same code (:data:`OPS`: agent/node/ops.py, agent/node/fence.py), answer
the same way (:func:`answer`) and keep it in the node's action log with the same writer
(:func:`log_action`; the file itself, its rotation and its lines: agent/host/actions.py).

The one thing the judge's door does otherwise: its stop and its fence are asked of the
supervisor by its own link, which cannot wait for its own end. ``inside`` leaves the stop's end
for the supervisor (agent/node/ops.py ``stop`` with ``wait`` False); the link answers, logs and
then sends its own process SIGTERM; what the stop left behind comes in the node's last state.
"""

import os

from . import fence as node_fence, folder as node, ops
from ..host import actions
from ..wire.protocol import RequestError


def stop(args, inside=False):
    """agent/node/ops.py ``stop``; ``inside``: asked of the supervisor by its own link."""
    return ops.stop(args, wait=not inside)


def fence(args, inside=False):
    """agent/node/fence.py ``fence``, its stop :func:`stop`."""
    return node_fence.fence(args, lambda stop_args: stop(stop_args, inside))


OPS = {"start": ops.start, "stop": stop, "restart": ops.restart, "fence": fence,
       "unfence": node_fence.unfence, "drop_workers": node_fence.drop_workers,
       "standby": node_fence.standby}


def answer(fn, args):
    """The answer to one request, without its id: ``{"ok": True, "data"}``, or ``{"ok":
    False, "kind", "error"}`` (a RequestError's kind; ``error`` for any other exception)."""
    try:
        data = fn(args)
    except RequestError as exc:
        return {"ok": False, "kind": exc.kind, "error": str(exc)}
    except Exception as exc:  # report, never die: other runs' streams go on
        return {"ok": False, "kind": "error", "error": "%s: %s" % (type(exc).__name__, exc)}
    return {"ok": True, "data": data}


def log_action(op, args, who, started, reply, read_only=False, refusals=None):
    """The one writer of a node's action log: request ``op`` (a change: agent/host/actions.py
    ``CHANGES``; any other is not logged) with ``args`` (``run_root``, ``node``), asked by
    ``who`` (a console's hello, or the judge's ``{"who": "judge", "console": "judge"}``) at
    ``started``, answered ``reply`` (:func:`answer`'s). Its result: ``ok``, ``<kind>: <error>``,
    or ``not done: why`` for an expel asked and not done; its detail: the request's
    ``detail``, else how a stop ends the run, else why a node is fenced. One without a run
    folder named (a sync before any run) is not logged, nor one of a node with no folder here
    (but a sync's, which makes it). ``read_only``: the connection is a watcher's, whose node
    folder is read as the run folders it may name (docs/SECURITY.md); its refusals pass
    ``refusals`` (agent/host/actions.py ``Refusals``: 20 at once, then one a minute)."""
    if op not in actions.CHANGES or not isinstance(args, dict) or not args.get("run_root") \
            or not args.get("node"):
        return
    result = "ok" if reply["ok"] else "%s: %s" % (reply.get("kind"), reply.get("error"))
    data = reply.get("data")
    if isinstance(data, dict) and data.get("expelled") is False:  # asked, not done
        result = "not done: %s" % data.get("why")
    end = args.get("end")
    why = args.get("fence").get("why") if isinstance(args.get("fence"), dict) else None
    detail = args.get("detail") or (
        "the run is over: %s" % end.get("state") if isinstance(end, dict) else why)
    try:
        ndir = node.node_dir(node.read_only_args(args) if read_only else args)
    except (TypeError, ValueError, RequestError):
        return
    # a sync comes before the run: it makes the node's folder; the others need one
    if not (op == "sync_commit" and not read_only or os.path.isdir(ndir)):
        return
    if reply.get("kind") == "read-only" and refusals is not None:  # a few lines, not a flood
        keep, before = refusals.take(ndir, actions.CHANGES[op], args["node"])
        if not keep:
            return
        detail = actions.left_out(before) if before else detail
    actions.record(ndir, actions.entry(actions.CHANGES[op], args["node"], who, started,
                                       result, detail))
