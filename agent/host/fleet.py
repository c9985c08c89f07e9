"""A host's record of its runs and incidents, beside its run folders: ``<workdir>/.rankdeck/
fleet.json`` (run folders are ``<workdir>/.rankdeck/runs/<run id>/<node>``).

Written by the supervisor of each node on this host when the node's run ends there (agent/
supervisor/supervisor.py ``finish``), read by `serve`'s ``hosts`` request (agent/serve/
hosts.py). A verdict that named a node while it ran (the judge's ``--on-hang restart``) waits
in the node's ``named.json`` until then. The user's alone (0600), written whole through one rename under a lock (two nodes
of one run on a host end at once), bounded (agent/rules/fleet.py ``KEEP_RUNS``). What an
entry holds and when a host is flagged: agent/rules/fleet.py.
"""

import fcntl
import os
import time

from ..rules import fleet as rules
from .runfiles import read_json, write_json_atomic

RECORD = "fleet.json"
MAX_BYTES = 1 << 20  # a record bigger than this is not read (its writer is not ours)


def record_path(runs_dir):
    """The host's record for run folders under ``runs_dir`` (``<workdir>/.rankdeck/runs``)."""
    return os.path.join(os.path.dirname(os.path.normpath(runs_dir)), RECORD)


def read(runs_dir):
    """The host's record: ``{"runs": [...]}`` (empty when missing, too big or unreadable)."""
    path = record_path(runs_dir)
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return {"runs": []}
    except OSError:
        return {"runs": []}
    record = read_json(path, None)
    if not isinstance(record, dict) or not isinstance(record.get("runs"), list):
        return {"runs": []}
    return record


NAMED = "named.json"  # in a node's folder: the verdicts that named it in this run


def note_named(node_dir, text):
    """A verdict named this node (the judge restarts it: ``--on-hang restart``); its end
    puts it in the host's record (:func:`named_in`)."""
    path = os.path.join(node_dir, NAMED)
    texts = named_in(node_dir)
    if len(texts) < rules.MAX_INCIDENTS:
        write_json_atomic(path, texts + [str(text)[:rules.MAX_TEXT]])


def named_in(node_dir):
    """The texts :func:`note_named` kept for this node's run."""
    texts = read_json(os.path.join(node_dir, NAMED), [])
    return [t for t in texts if isinstance(t, str)] if isinstance(texts, list) else []


def note_end(node_dir, run_id, node, state, incidents, ended=None):
    """The end of ``node``'s run ``run_id`` (its folder ``node_dir``) in the host's record."""
    runs_dir = os.path.dirname(os.path.dirname(os.path.normpath(node_dir)))
    path = record_path(runs_dir)
    fd = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        record = rules.add_run(read(runs_dir), run_id, node, {
            "state": state, "incidents": incidents,
            "ended": time.time() if ended is None else ended})
        old = os.umask(0o077)
        try:
            write_json_atomic(path, record)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
    finally:
        os.close(fd)
