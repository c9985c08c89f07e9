"""What a node reports for a verdict: each rank's stack (agent/torchrun/stacks.py) and the tail of its
flight recorder, read live through the hook (agent/torchrun/frhook.py).

A trace is cut down here, on the host, to what the console's verdict reads: per entry the
process group, collective sequence number, op, sizes, whether it finished, and when it was
entered; the newest ``KEEP`` entries only. Stack traces inside the trace are left out (the
py-spy stack says where a rank is, with line numbers).

With the stack go the source lines of its frames (``sources``: ``"file:line"`` -> the line,
stripped), read here because the files are the host's: the console shows the suspect's line.
Bounded: at most ``SOURCES_MAX`` locations a rank, regular files only, lines up to
``SOURCE_LINE_MAX`` and ``SOURCE_BYTES_MAX`` into a file, ``SOURCE_TEXT_MAX`` characters each.
"""

import errno
import os
import re
import stat
import time

from ..host import procs
from .frhook import NO_RECORDER
from ..host.runfiles import file_id, read_json
from .stacks import dump_stacks

KEEP = 64
ANSWER_WAIT = 3.0
SOURCES_MAX = 64
SOURCE_LINE_MAX = 100000
SOURCE_TEXT_MAX = 240
SOURCE_BYTES_MAX = 4 << 20  # a source file is read this far at most
VERSION_MAX = 40  # characters of a torch version a rank reports
# a frame in py-spy's dump ("    train_step (trainer/train.py:238)") or faulthandler's
# ('  File "trainer/train.py", line 238 in train_step')
_FRAME = re.compile(r'^\s+\S+ \((.+?):(\d+)\)\s*$|^\s+File "(.+?)", line (\d+) in ')


LISTEN_WAIT = 3.0  # seconds a busy hook (answering another asker) is waited for


def request(fr_dir, pid, wait=ANSWER_WAIT):
    """Ask the hook in ``pid`` for its trace; the parsed JSON, or {"error": why}."""
    asked = ask(fr_dir, pid)
    if "error" in asked:
        return asked
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        data = answer(fr_dir, pid, asked)
        if data is not None:
            return data
        time.sleep(0.02)
    return {"error": "the rank did not answer within %.0f s" % wait}


def ask(fr_dir, pid):
    """Write the request byte into ``pid``'s FIFO without waiting: ``{"before": ...}`` to pass
    to :func:`answer`, or {"error": why}. The answer file is never removed: the agent's
    ``why`` and the supervisor's periodic sample (agent/supervisor/ranksample.py) may ask at once, and
    each waits for a file newer than the one it saw (one rename makes each answer)."""
    req = os.path.join(fr_dir, "%d.req" % pid)
    before = file_id(os.path.join(fr_dir, "%d.json" % pid))
    # ENXIO: no reader has the FIFO open. The hook reopens it once it has answered the
    # previous asker (the judge's two samples, the periodic sampler and a console's `why` may
    # come close together), so keep trying for a moment before saying it does not listen.
    deadline = time.monotonic() + LISTEN_WAIT
    while True:
        try:
            fd = os.open(req, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return {"error": "no flight-recorder hook in this rank (RANKDECK_FLIGHT_RECORDER"
                                 "=0, or a run started before rankdeck had it)"}
            if exc.errno != errno.ENXIO:
                raise
            if time.monotonic() >= deadline:
                return {"error": "the rank's flight-recorder hook is not listening"}
            time.sleep(0.02)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    return {"before": before}


def answer(fr_dir, pid, asked):
    """The trace the hook wrote since :func:`ask` returned ``asked``, or None (not yet)."""
    out = os.path.join(fr_dir, "%d.json" % pid)
    if file_id(out) in (None, asked["before"]):
        return None
    return read_json(out)


def summary(trace):
    """The verdict's view of one rank's trace: its newest entries, compact."""
    if "error" in trace:
        out = {"error": str(trace["error"])}
        if trace.get(NO_RECORDER):  # which torch lacks it: the verdict says so
            out[NO_RECORDER] = str(trace[NO_RECORDER])[:VERSION_MAX]
        return out
    entries = []
    for e in (trace.get("entries") or [])[-KEEP:]:
        entries.append({
            "pg": str(e.get("pg_id")), "seq": e.get("collective_seq_id"),
            "p2p": bool(e.get("is_p2p")), "op": e.get("profiling_name"),
            "in": e.get("input_sizes"), "out": e.get("output_sizes"),
            "done": bool(e.get("retired")), "t_ns": e.get("time_created_ns"),
        })
    return {"entries": entries}


def frame_locations(stack):
    """``(file, line)`` of every frame in a stack dump, in order, each once."""
    found = []
    for text in stack.splitlines():
        m = _FRAME.match(text)
        if m:
            where = (m.group(1) or m.group(3), int(m.group(2) or m.group(4)))
            if where not in found:
                found.append(where)
    return found


def source_line(path, line):
    """Line ``line`` of the regular file ``path`` (within its first ``SOURCE_BYTES_MAX``),
    stripped and cut; None if unreadable."""
    if not 0 < line <= SOURCE_LINE_MAX:
        return None
    try:
        # O_NONBLOCK: a FIFO named like a source file must not hang the agent
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        lines = f.read(SOURCE_BYTES_MAX).split(b"\n", line)
    if len(lines) <= line - 1 or (len(lines) == line and not lines[-1]):
        return None
    text = lines[line - 1][:SOURCE_TEXT_MAX * 4].decode("utf-8", "replace")
    return text.strip()[:SOURCE_TEXT_MAX]


def search_dirs(pid):
    """Where a relative frame path of ``pid`` may start: py-spy shortens a file to its path
    below the ``sys.path`` entry it was found in; faulthandler prints it as imported. So: the
    rank's working directory, its script's folder and that folder's parent (a script that
    puts its project on sys.path itself, as trainer/train.py does), its PYTHONPATH."""
    proc = "/proc/%d" % pid
    dirs = []
    try:
        cwd = os.readlink(proc + "/cwd")
        dirs.append(cwd)
        with open(proc + "/cmdline", "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
        scripts = [a for a in argv[1:3] if a.endswith(".py")]
        for script in scripts[:1]:
            folder = os.path.dirname(os.path.join(cwd, script))
            dirs.extend([folder, os.path.dirname(folder)])
    except OSError:
        return dirs
    dirs.extend(os.path.join(cwd, d) for d in procs.environ(pid).get("PYTHONPATH", "").split(":")
                if d)
    return dirs


def _read_relative(path, line, dirs):
    for base in dirs:
        text = source_line(os.path.join(base, path), line)  # join keeps an absolute path
        if text is not None:
            return text
    return None


def sources(stack, pid):
    """``{"file:line": source line}`` for the frames of a rank's stack (:func:`search_dirs`
    for a relative file)."""
    dirs = search_dirs(pid) or ["/"]
    out = {}
    for path, line in frame_locations(stack or "")[:SOURCES_MAX]:
        text = _read_relative(path, line, dirs)
        if text:
            out["%s:%d" % (path, line)] = text
    return out


def node_report(ndir, args):
    """Every rank of the node: pid, rank, stack (py-spy or faulthandler), the stack's
    ``sources`` and ``fr``."""
    stacks = dump_stacks(ndir, args)
    fr_dir = os.path.join(ndir, "fr")
    for rank in stacks.get("ranks", []):
        rank["sources"] = sources(rank.get("stack"), rank["pid"])
        rank["fr"] = summary(request(fr_dir, rank["pid"]))
    stacks["time"] = time.time()
    return stacks

