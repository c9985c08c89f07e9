"""Who changed a run, and who watches it: a node's action log and its attached consoles.

The action log is ``<node dir>/actions.jsonl``: one JSON object a line, appended by `serve`
after every request that changes the run on this node (``CHANGES``: launch, stop, restart,
sync, cordon, signal, and the store's host's expel of a fenced node's torchrun from the
rendezvous), never rewritten. Each line says who asked (``who``: the ``user@laptop``
the console sent, unverified; ``login``: the account this agent runs as, which the SSH login
proved), what, which node, when and how it went. A line is written with one ``write`` on an
``O_APPEND`` descriptor, so lines of several consoles' serves never interleave.

The log is bounded: once ``actions.jsonl`` would pass :data:`LOG_MAX` bytes it is renamed
``actions.jsonl.1`` (the one before is dropped) and a new one begins with a line
``{"base": N}``, the offset its first byte has in the log's whole history. Offsets a reader
keeps (the ``actions`` request's ``offset``, a subscription's ``actions_from``) are offsets in
that history, so they stay good across a rotation; a reader behind the kept two files goes
on from the oldest line kept (:func:`read_page`'s ``start`` says so). A connection's refused
requests are logged at most :data:`REFUSED_BURST` at once and one a :data:`REFUSED_EVERY`
seconds after (:class:`Refusals`), the rest counted in one line.

A console that attached (the ``hello`` request with ``attach``) is listed in
``<node dir>/consoles/<serve pid>.json`` while its connection lives; a serve that died without
removing its file is left out by its pid (:func:`attached`). docs/PROTOCOL.md has the fields.
"""

import fcntl
import getpass
import json
import os
import threading
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
LOG_MAX = 4 << 20  # actions.jsonl is rotated before it passes this (two files kept at most)
OLD = LOG + ".1"  # the log before the last rotation
BASE_KEY = b'{"base":'  # the first line of a rotated log: {"base": N}
REFUSED_BURST = 20  # a connection's refused requests logged at once ...
REFUSED_EVERY = 60.0  # ... then one a this many seconds; the rest counted (Refusals)


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
    comes before the run starts there), rotating the log first when it is full. An unwritable
    folder loses the line, not the action."""
    line = (json.dumps(entry, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
            + "\n").encode("ascii")
    path = os.path.join(ndir, LOG)
    try:
        os.makedirs(ndir, 0o700, exist_ok=True)
        for _ in range(8):  # another serve rotated it meanwhile: the new file
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                _lock(fd)  # one writer at a time decides on a rotation (serves, the judge's link)
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    continue
                size = os.fstat(fd).st_size
                if size and size + len(line) > LOG_MAX:
                    _rotate(ndir, size)
                    continue
                os.write(fd, line)
                return
            finally:
                os.close(fd)  # the lock goes with it
    except OSError:
        pass


def _lock(fd):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # a file system without locks: rotations may race, lines still whole
        pass


def _rotate(ndir, size):
    """actions.jsonl -> actions.jsonl.1; a new actions.jsonl that begins at its end."""
    path = os.path.join(ndir, LOG)
    with open(path, "rb") as f:
        base = _base(f) + size
    tmp = path + ".%d.tmp" % os.getpid()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, BASE_KEY + b"%d}\n" % base)
    finally:
        os.close(fd)
    os.rename(path, os.path.join(ndir, OLD))
    os.rename(tmp, path)


def _base(f):
    """Where the open log file ``f`` begins in the log's history (its ``{"base": N}`` line;
    0 for a log never rotated)."""
    try:
        f.seek(0)
        head = f.read(64)
        if head.startswith(BASE_KEY):
            return int(head[len(BASE_KEY):head.index(b"}")])
    except (OSError, ValueError):
        pass
    return 0


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
    """Whole lines of the node's log from offset ``offset``: (entries, offset past them).
    A line that is not JSON (a damaged file) is skipped, not fatal."""
    page = read_page(ndir, offset, limit)
    return page["actions"], page["end"]


def read_page(ndir, offset=0, limit=READ_MAX):
    """Whole lines of the node's log from offset ``offset`` (in the log's history), at most
    ``limit`` bytes of them: ``{"actions", "end"}`` (the offset past them), ``start`` (where
    reading began: past ``offset`` when the lines there were rotated away) and ``more``
    (whether the log goes on past ``end``)."""
    offset = max(0, int(offset))
    files = []  # (file, its base): actions.jsonl first, so a rotation meanwhile finds it again
    try:
        for name in (LOG, OLD):
            try:
                f = open(os.path.join(ndir, name), "rb")
            except OSError:
                continue
            files.append((f, _base(f), os.fstat(f.fileno()).st_size))
        files.sort(key=lambda item: item[1])
        if not files:
            return {"actions": [], "start": offset, "end": offset, "more": False}
        # the newest file that begins at or before the offset, else the oldest kept
        i = max([k for k, item in enumerate(files) if item[1] <= offset] or [0])
        while i + 1 < len(files) and offset >= files[i][1] + files[i][2]:
            i += 1  # all of it read: on into the next
        f, base, size = files[i]
        start = max(offset, base)
        f.seek(start - base)
        data = f.read(limit)
    finally:
        for item in files:
            item[0].close()
    whole = data[:data.rfind(b"\n") + 1]
    end = start + len(whole)
    if i + 1 < len(files) and not whole:  # a rotated file's cut line: past it, never stuck
        end = start + len(data) if data else base + size
    more = end > start and (i + 1 < len(files) or end < base + size)
    return {"actions": _entries(whole), "start": start, "end": end, "more": more}


def _entries(data):
    out = []
    for line in data.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and not (line.startswith(BASE_KEY) and "action" not in item):
            out.append(item)
    return out


class Refusals:
    """One connection's refused requests, as its serve logs them: :data:`REFUSED_BURST` lines,
    then one a :data:`REFUSED_EVERY` seconds; the ones left out are counted by node folder,
    and said in the next line kept there or, when the connection ends, in one line of their
    own (:meth:`tell`). A watcher's loop of refused requests (6,000 in a third of a second)
    is thus a few lines, not a log that grows without end."""

    def __init__(self, burst=REFUSED_BURST, every=REFUSED_EVERY):
        self.burst, self.every = burst, every
        self.tokens, self.at = float(burst), time.monotonic()
        self.dropped = {}  # node folder -> [how many, the last one's action and node]
        self.lock = threading.Lock()

    def take(self, ndir, action, node):
        """Whether to log this refusal; and how many were left out in ``ndir`` before it."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) / self.every)
            self.at = now
            if self.tokens < 1:
                count = self.dropped.setdefault(ndir, [0, action, node])
                count[:] = [count[0] + 1, action, node]
                return False, 0
            self.tokens -= 1
            return True, self.dropped.pop(ndir, [0])[0]

    def untold(self):
        """``{ndir: (count, action, node)}`` left out and not said yet; forgotten here."""
        with self.lock:
            out, self.dropped = self.dropped, {}
        return {ndir: tuple(v) for ndir, v in out.items()}

    def tell(self, who):
        """One line in each node's log for its refusals left out and not said yet (the
        connection ends); ``who``: the console, as :func:`entry` takes it."""
        for ndir, (count, action, node) in self.untold().items():
            record(ndir, entry(action, node, who, time.time(), "read-only: refused",
                               left_out(count)))


def left_out(count):
    """The words a log line carries for ``count`` refused requests not logged."""
    return "%d more refused request%s of this connection not logged (at most %d at once, " \
        "then one a minute)" % (count, "" if count == 1 else "s", REFUSED_BURST)


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
