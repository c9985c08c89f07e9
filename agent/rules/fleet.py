"""A host's record across runs, and when it is flagged (plain data, no I/O, no threads).

Each host keeps a small record of its last runs beside its run folders (agent/host/fleet.py
writes it when a node's run ends there); the laptop's history adds what it saw. One rule reads
both, on both sides: a host with incidents in ``FLAG_RUNS`` (2) of its last ``LAST_RUNS`` (5)
runs is **flagged** (`rankdeck hosts`, a launch's warning, ``--avoid-flagged``).

An entry of the record is ``{"run_id", "ended", "nodes": {node: {"state", "incidents"}}}``;
an incident is ``{"kind", "text"}`` with ``kind`` one of ``KINDS``. ``deep-check`` is kept for
the results of a deep check (`rankdeck check --deep`), which writes them into the same record.
Standard library only; Python >= 3.9.
"""

KEEP_RUNS = 20  # entries a host's record keeps, newest last
LAST_RUNS = 5
FLAG_RUNS = 2
MAX_INCIDENTS = 8  # per node per run
MAX_TEXT = 200
KINDS = ("verdict", "crashed", "gpu-error", "cordoned", "deep-check")


def incident(kind, text):
    """One incident, its text bounded and on one line."""
    text = " ".join(str(text or "").split())
    return {"kind": kind if kind in KINDS else "crashed", "text": text[:MAX_TEXT]}


def node_incidents(state, cause=None, fenced=None, gpu_errors=(), named=()):
    """The incidents of one node's run, from how its supervisor saw it end: ``state`` (its
    end: exited, failed, stopped), ``cause`` (state.json's), ``fenced`` (fenced.json's content
    when the node was cordoned, else None), ``gpu_errors`` (texts of the Xid and ECC errors
    its GPUs reported during the run), ``named`` (the verdicts that named it while it ran, for
    which the judge restarted it). A node fails too when a peer fails; only a failure of
    one of its own ranks (the cause names a local rank) or of its supervisor is its crash,
    and a stop that a verdict asked is an incident only for the node(s) the verdict named
    (the cause's ``named``)."""
    out = []
    cause = cause if isinstance(cause, dict) else {}
    message = cause.get("message") if isinstance(cause.get("message"), str) else ""
    for text in list(named)[:MAX_INCIDENTS]:
        out.append(incident("verdict", text or "named by the verdict"))
    if cause.get("named") is True:
        out.append(incident("verdict", message or "named by the verdict"))
    elif state == "failed" and (cause.get("local_rank") is not None
                                or message.startswith("supervisor crashed")):
        out.append(incident("crashed", message or "failed"))
    for text in list(gpu_errors)[:MAX_INCIDENTS]:
        out.append(incident("gpu-error", text))
    if fenced is not None:
        why = fenced.get("why") if isinstance(fenced, dict) else None
        out.append(incident("cordoned", why or "cordoned"))
    return out[:MAX_INCIDENTS]


def add_run(record, run_id, node, entry, keep=KEEP_RUNS):
    """``record`` (a host's, as read: anything) with ``entry`` (``{"state", "incidents",
    "ended"}``) for ``node`` of ``run_id``: a run already there takes the node beside its
    others. Newest last, at most ``keep`` runs."""
    runs = [r for r in (record or {}).get("runs") or [] if _run_ok(r)] \
        if isinstance(record, dict) else []
    found = next((r for r in runs if r["run_id"] == run_id), None)
    if found is None:
        found = {"run_id": run_id, "nodes": {}}
        runs.append(found)
    found["ended"] = entry.get("ended")
    found["nodes"][str(node)[:255]] = {"state": str(entry.get("state"))[:40],
                                       "incidents": list(entry.get("incidents") or [])[
                                           :MAX_INCIDENTS]}
    runs.sort(key=_ended)
    return {"version": 1, "runs": runs[-keep:]}


def _run_ok(run):
    return isinstance(run, dict) and isinstance(run.get("run_id"), str) \
        and isinstance(run.get("nodes"), dict)


def _ended(run):
    """A run's end time for ordering: a number, else 0 (a record is read as anything)."""
    ended = run.get("ended")
    return ended if isinstance(ended, (int, float)) and ended == ended else 0


def merged(host_runs, laptop_runs=()):
    """A host's runs from its record and what the laptop saw, one entry per run id (the
    host's first: it was there), newest last."""
    seen = {}
    for run in list(host_runs or []) + list(laptop_runs or []):
        if not _run_ok(run):
            continue
        have = seen.setdefault(run["run_id"], {"run_id": run["run_id"], "nodes": {},
                                               "ended": run.get("ended")})
        for node, entry in run["nodes"].items():
            if isinstance(entry, dict):
                have["nodes"].setdefault(node, entry)
    return sorted(seen.values(), key=_ended)


def run_incidents(run):
    """Every incident of one run on the host, each with its ``run_id`` and ``node``."""
    out = []
    for node, entry in sorted(run.get("nodes", {}).items()):
        found = entry.get("incidents") if isinstance(entry, dict) else None
        for inc in found[:MAX_INCIDENTS] if isinstance(found, list) else []:
            if isinstance(inc, dict):
                out.append(dict(incident(inc.get("kind"), inc.get("text")),
                                run_id=run["run_id"], node=node))
    return out


def judged(runs, last=LAST_RUNS, needed=FLAG_RUNS):
    """``{"runs": [run ids, newest last], "incidents": [...], "flagged": bool}`` over the
    host's last ``last`` runs: flagged when ``needed`` of them had an incident."""
    recent = [r for r in runs if _run_ok(r)][-last:]
    incidents = [run_incidents(r) for r in recent]
    return {"runs": [r["run_id"] for r in recent],
            "incidents": [i for per in incidents for i in per],
            "flagged": sum(1 for per in incidents if per) >= needed}
