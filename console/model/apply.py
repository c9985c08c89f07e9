"""Applying a node's news to the run's model (the reducer): its journal records (the
``recs`` of a ``journal`` message: log data, metrics, files, checkpoints, supervisor events,
samples) and its state.json (a ``state`` message). ``run`` is the RunState (console/model/state.py);
ranks' claims and progress are console/model/ranks.py's.
"""

from __future__ import annotations

from agent.rules.judge import how_it_ended
from . import rendezvous
from ..lines.lines import split_lines
from ..lines.sanitize import clean
from .nodes import ENDED, FileInfo, LineBatch, NodeState
from .ranks import metric, sample, settle_claims, take_file
from ..lines.text import human_bytes, kill_summary


def apply_records(run, node: str, recs: list, end: int) -> None:
    """Journal records from a node's agent (the ``recs`` of a ``journal`` message)."""
    ns = run.nodes[node]
    for rec in recs:
        meta = rec[0]
        if meta.get("j") is not None:  # a record refused: a reconnect resumes at it
            ns.journal_offset = meta["j"]
        kind = meta.get("k")
        if kind == "data":
            _data(run, ns, meta, rec[1] if len(rec) > 1 else "")
        elif kind == "metric":
            metric(run, ns, meta)
        elif kind == "file":
            take_file(run, ns, meta)
        elif kind == "ckpt":
            _checkpoint(run, ns, meta)
        elif kind in ("ckpt_done", "resumed"):
            _checkpoint_news(run, ns, meta)
        elif kind == "ckpt_gone":
            gone = run.checkpoints.gone(node, meta)
            if gone is not None:
                run.add_event(node, "checkpoint deleted", "checkpoint step %s deleted by "
                              "the trainer: %s" % (gone.step, gone.path), gone.rank,
                              meta.get("ts"))
        elif kind == "event":
            _supervisor_event(run, ns, meta)
        elif kind == "sample":
            sample(run, ns, meta)
        for cb in run.record_listeners:  # export: every record, once the reducer has it
            cb(node, meta)
    ns.journal_offset = end
    if run.held:
        settle_claims(run)
    run.changed(node)


def _checkpoint(run, ns: NodeState, meta: dict) -> None:
    fi = ns.files.get(meta.get("f"))
    ckpt = run.checkpoints.saved(ns.name, fi.rank if fi else None, meta)
    if ckpt is None:  # seen in --checkpoint-dir already
        return
    run.add_event(ns.name, "checkpoint", "checkpoint step %s saved: %s%s" % (
        ckpt.step, ckpt.path, " (%s)" % human_bytes(ckpt.bytes) if ckpt.bytes else ""),
        ckpt.rank, meta.get("ts"))


def _checkpoint_news(run, ns: NodeState, meta: dict) -> None:
    """A save found complete or not (``ckpt_done``), a resume line (``resumed``)."""
    fi = ns.files.get(meta.get("f"))
    rank = fi.rank if fi else None
    if meta.get("k") == "resumed":
        got = run.checkpoints.resume(ns.name, rank, meta)
        if got is not None:
            run.add_event(ns.name, "resumed", "ranks resumed from checkpoint step %s: %s"
                          % (got.step, got.path or "?"), rank, meta.get("ts"))
        return
    ckpt = run.checkpoints.done(ns.name, meta)
    if ckpt is None:
        return
    if ckpt.complete:
        took = "" if ckpt.seconds is None else " in %.1f s" % ckpt.seconds
        kind, text = "checkpoint complete", "checkpoint step %s complete: %s%s" % (
            ckpt.step, human_bytes(ckpt.bytes or 0), took)
    else:
        kind, text = "checkpoint incomplete", "checkpoint step %s incomplete: %s lacks %s" % (
            ckpt.step, ckpt.path, ", ".join(ckpt.missing or []) or "nothing named")
    run.add_event(ns.name, kind, text, ckpt.rank, meta.get("ts"))


def _data(run, ns: NodeState, meta: dict, text: str) -> None:
    fi = ns.files.get(meta.get("f"))
    if fi is None:  # data for a file we never saw announced (or forgot): on the node
        fi = ns.stray = ns.stray or FileInfo(-1, None, None, "unknown", None, None, "")
    lines, fi.partial = split_lines(fi.partial, text, run.masker)
    run.total_lines += len(lines)
    ts, journal = meta.get("ts", 0.0), meta.get("j")
    if fi.rank is not None and fi.rank in run.ranks:
        run.ranks[fi.rank].lines.add(ts, ns.name, journal, lines)
    else:
        ns.lines.add(ts, ns.name, journal, lines)
    batch = LineBatch(ns.name, fi.rank, fi.local_rank, fi.stream, fi.path, meta.get("o", 0),
                      text, lines, ts, journal)
    for cb in run.line_listeners:
        cb(batch)


def _supervisor_event(run, ns: NodeState, meta: dict) -> None:
    what = meta.get("what")
    ts = meta.get("ts")
    if what == "launched":
        ns.state = "starting"
        ns.worker_failure = None
        run.add_event(ns.name, "launched", "%s started (pid %s, launch %s)" % (
            run.launcher, meta.get("pid"), meta.get("launch")), ts=ts)
    elif what == "restarting":
        ns.state = "restarting"
        run.add_event(ns.name, "restarting", "restart requested", ts=ts)
    elif what == "worker_failed":
        ns.worker_failure = meta
        run.add_event(ns.name, "worker failed", "rank %s (local rank %s) %s; torchrun "
                      "restarts its workers if it has restarts left" % (
                          meta.get("rank"), meta.get("local_rank"),
                          how_it_ended(meta.get("exit_code"))), meta.get("rank"), ts)
    elif what == "killed":
        report = meta.get("report") or {}
        run.add_event(ns.name, "killed", kill_summary(report), ts=ts)
    elif what == "stopping":
        ns.state = "stopping"
        run.add_event(ns.name, "stopping", "stop requested", ts=ts)
    elif what == "ended":
        state = meta.get("state")
        ns.exit_code = meta.get("exit_code")
        cause = meta.get("cause") or {}
        ns.cause = clean(cause.get("message") or "", run.masker) or None
        ns.state = state
        for rs in run.ranks.values():
            if rs.node == ns.name and rs.state != "failed":
                rs.state = "failed" if state == "failed" else "exited"
        if state == "failed" and cause.get("rank") is not None:
            bad = run.ranks.get(cause["rank"])
            if bad:
                bad.state = "failed"
        known = ns.exit_code is not None  # a node rankdeck ended has none (agent/rules/judge.py ends_due)
        text = {"exited": "exited %s" % ns.exit_code if known else "exited",
                "stopped": "stopped: %s" % ns.cause if ns.cause else "stopped"}.get(
            state, "failed%s: %s" % (" (exit %s)" % ns.exit_code if known else "", ns.cause))
        run.add_event(ns.name, state, text, cause.get("rank") if cause else None, ts=ts)


def apply_supervisor_state(run, node: str, st: dict | None) -> None:
    """A node's state.json (from a ``state`` message)."""
    if not st:
        return
    ns = run.nodes[node]
    ns.state_seen = True
    # null is "not said" (the checks let it through): the counts as they were
    if st.get("restarts") is not None:
        ns.restarts = st["restarts"]
    if st.get("max_restarts") is not None:
        ns.max_restarts = st["max_restarts"]
    if "phase" in st:
        ns.phase = rendezvous.phase_of(st["phase"], run.masker)
    sup = st.get("state")
    if sup == "lost" and ns.state != "lost":
        ns.state = "lost"
        ns.cause = "supervisor died; processes may be left (rankdeck stop kills them)"
        run.add_event(node, "lost", ns.cause)
    elif sup in ENDED and not ns.ended:
        ns.state = sup
        ns.exit_code = st.get("exit_code")
        cause = st.get("cause") or {}
        ns.cause = clean(cause.get("message") or "", run.masker) or None
    elif sup in ("restarting", "stopping"):
        ns.state = sup
    elif sup == "running" and ns.state in ("connecting", "unreachable", "lost", "gone"):
        ns.state = "starting" if not _node_stepping(run, node) else "running"
    if run.held:
        settle_claims(run)
    run.changed(node)


def _node_stepping(run, node: str) -> bool:
    return any(r.node == node and r.state == "running" for r in run.ranks.values())
