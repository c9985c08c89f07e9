"""What a node reports for a verdict: each rank's stack (agent/stacks.py) and the tail of its
flight recorder, read live through the hook (agent/frhook.py).

A trace is cut down here, on the host, to what the console's verdict reads: per entry the
process group, collective sequence number, op, sizes, whether it finished, and when it was
entered; the newest ``KEEP`` entries only. Stack traces inside the trace are left out (the
py-spy stack says where a rank is, with line numbers).
"""

import errno
import os
import time

from .runfiles import read_json
from .stacks import dump_stacks

KEEP = 64
ANSWER_WAIT = 3.0


def request(fr_dir, pid, wait=ANSWER_WAIT):
    """Ask the hook in ``pid`` for its trace; the parsed JSON, or {"error": why}."""
    req = os.path.join(fr_dir, "%d.req" % pid)
    out = os.path.join(fr_dir, "%d.json" % pid)
    try:
        os.unlink(out)
    except OSError:
        pass
    try:
        fd = os.open(req, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return {"error": "no flight-recorder hook in this rank (RANKDECK_FLIGHT_RECORDER=0, "
                             "or a run started before rankdeck had it)"}
        if exc.errno == errno.ENXIO:
            return {"error": "the rank's flight-recorder hook is not listening"}
        raise
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        data = read_json(out)
        if data is not None:
            return data
        time.sleep(0.02)
    return {"error": "the rank did not answer within %.0f s" % wait}


def summary(trace):
    """The verdict's view of one rank's trace: its newest entries, compact."""
    if "error" in trace:
        return {"error": str(trace["error"])}
    entries = []
    for e in (trace.get("entries") or [])[-KEEP:]:
        entries.append({
            "pg": str(e.get("pg_id")), "seq": e.get("collective_seq_id"),
            "p2p": bool(e.get("is_p2p")), "op": e.get("profiling_name"),
            "in": e.get("input_sizes"), "out": e.get("output_sizes"),
            "done": bool(e.get("retired")), "t_ns": e.get("time_created_ns"),
        })
    return {"entries": entries}


def node_report(ndir, args):
    """Every rank of the node: pid, rank, stack (py-spy or faulthandler) and ``fr``."""
    stacks = dump_stacks(ndir, args)
    fr_dir = os.path.join(ndir, "fr")
    for rank in stacks.get("ranks", []):
        rank["fr"] = summary(request(fr_dir, rank["pid"]))
    stacks["time"] = time.time()
    return stacks

