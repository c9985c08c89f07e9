"""Who changed a run, and who watches it: a node's action log and its attached consoles.

The action log is ``<node dir>/actions.jsonl``: one JSON object a line, appended by `serve`
after every request that changes the run on this node (``CHANGES``: launch, stop, restart,
sync, cordon, signal, and the store's host's expel of a fenced node's torchrun from the
rendezvous), never rewritten. Each line says who asked (``who``: the ``user@laptop``
the console sent, unverified; ``login``: the account this agent runs as, which the SSH login
proved), what, which node, when and how it went. A line is written with one ``write`` on an
``O_APPEND`` descriptor, so lines of several consoles' serves never interleave.

A console that attached (the ``hello`` request with ``attach``) is listed in
``<node dir>/consoles/<serve pid>.json`` while its connection lives; a serve that died without
removing its file is left out by its pid (:func:`attached`). docs/PROTOCOL.md has the fields.
"""

import getpass
import json
import os
import time

from . import procs

LOG = "actions.jsonl"
CONSOLES = "consoles"
# a request's op -> the action it is in the log; ops not here do not change a run
CHANGES = {"start": "launch", "stop": "stop", "restart": "restart", "sync_commit": "sync",
           "fence": "cordon", "unfence": "uncordon", "standby": "launch", "cordon": "cordon",
           "uncordon": "uncordon", "signal": "signal",
           "drop_workers": "cordon",  # a hung node's cordon, on the other nodes
           "expel": "expel"}  # its dead torchrun out of the rendezvous, on the store's host
TEXT_MAX = 200  # who, detail and result: a console's text, kept short
READ_MAX = 1 << 20  # bytes of the log one read returns at most


def login():
    """The account this agent runs as (the SSH login), or "?" where the system cannot say."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, no LOGNAME
        return "uid %d" % os.getuid()


def short(text):
    return str(text)[:TEXT_MAX]


def record(ndir, entry):
    """Append ``entry`` (an action) to the node's log, making the folder if needed (a sync
    comes before the run starts there). An unwritable folder loses the line, not the action."""
    line = (json.dumps(entry, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
            + "\n").encode("ascii")
    try:
        os.makedirs(ndir, 0o700, exist_ok=True)
        fd = os.open(os.path.join(ndir, LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


def entry(action, node, who, started, result, detail=None):
    """One line of the log: ``result`` is "ok" or the error's words."""
    out = {"ts": round(started, 3), "took_s": round(time.time() - started, 3),
           "action": action, "node": short(node), "who": short(who.get("who") or "?"),
           "console": short(who.get("console") or ""), "login": login(),
           "result": short(result)}
    if detail:
        out["detail"] = short(detail)
    return out


def read(ndir, offset=0, limit=READ_MAX):
    """Whole lines of the node's log from byte ``offset``: (entries, offset past them).
    A line that is not JSON (a damaged file) is skipped, not fatal."""
    try:
        with open(os.path.join(ndir, LOG), "rb") as f:
            f.seek(max(0, int(offset)))
            data = f.read(limit)
    except OSError:
        return [], offset
    whole = data[:data.rfind(b"\n") + 1]
    out = []
    for line in whole.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out, offset + len(whole)


# -- consoles attached ---------------------------------------------------------------------
def join(ndir, who):
    """List this serve (its pid) among the node's consoles; the file's path, or None."""
    folder = os.path.join(ndir, CONSOLES)
    path = os.path.join(folder, "%d.json" % os.getpid())
    me = procs.stat(os.getpid())
    item = dict(who, pid=os.getpid(), starttime=me.starttime if me else None, login=login())
    try:
        os.makedirs(folder, 0o700, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(item, f)
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def leave(path):
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def attached(ndir):
    """The consoles attached to the node now, oldest first (dead serves left out)."""
    folder = os.path.join(ndir, CONSOLES)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                item = json.load(f)
        except (OSError, ValueError):
            continue
        pid = item.get("pid") if isinstance(item, dict) else None
        if isinstance(pid, int) and procs.alive(pid, item.get("starttime")):
            out.append({k: item.get(k) for k in ("who", "console", "role", "since", "login")})
    out.sort(key=lambda c: c.get("since") or 0)
    return out
