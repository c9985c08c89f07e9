"""The run's goodput as its judge keeps it live (docs/GOODPUT.md, "The judge's report").

The judge (agent/judge/judge.py) feeds one reducer (agent/rules/goodput.py) every meta its nodes'
supervisors forward (agent/judge/listen.py) and every event it writes into its journal, as they
come; every :data:`REPORT_EVERY` s, and when it ends, it writes the reducer's report into
``<run_root>/judge/goodput.json``: one small JSON file (the report is bounded: MAX_INCIDENTS
incidents at most), written atomically, owner-only. serve's ``goodput`` request reads it back
(:func:`read_report`, docs/PROTOCOL.md), so `rankdeck goodput RUN` and `status --json` need no
replay of the journals while the judge's report is fresh.

Its clock is the judge's: the judge's events are on its host's clock, and each node's records
are put on it by the offset its ranks' stalls show (agent/rules/goodput.py).

Standard library only; Python >= 3.9.
"""

import json
import os
import time

from ..rules.goodput import Goodput

NAME = "goodput.json"
REPORT_EVERY = 30.0  # seconds between two reports the judge writes while the run goes on
MAX_BYTES = 1 << 20  # a report file larger than this is not read (no report is near it)
VERSION = 1


class JudgeGoodput:
    """The judge's reducer and its report file; fed under the judge's lock."""

    def __init__(self, jdir):
        self.reducer = Goodput()
        self.path = os.path.join(jdir, NAME)
        self.written = None  # time.monotonic() of the last report written

    def add(self, node, meta):
        self.reducer.add(node, meta)

    def due(self):
        return self.written is None or time.monotonic() - self.written >= REPORT_EVERY

    def report(self, over):
        """The report now (``over``: the judge has said the run ended: its wall ends there)."""
        return self.reducer.report(None if over else time.time())

    def write(self, report):
        """``report`` into the run's folder: atomically, owner-only. False when it could not
        be written (a full disk): the judge goes on, a console replays the journals."""
        self.written = time.monotonic()
        doc = {"v": VERSION, "written": time.time(), "report": report}
        tmp = "%s.tmp.%d" % (self.path, os.getpid())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except (OSError, ValueError):
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        return True


def read_report(jdir):
    """serve's ``goodput``: ``{"report", "written", "now"}`` of the judge's newest report
    (``now``: this host's clock, so a console tells its age without comparing clocks);
    ``report`` None when there is none (no judge, an older one, a file that is no report)."""
    out = {"report": None, "written": None, "now": time.time()}
    path = os.path.join(jdir, NAME)
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return out
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return out
    if isinstance(doc, dict) and doc.get("v") == VERSION and isinstance(doc.get("report"), dict):
        out.update(report=doc["report"], written=doc.get("written"))
    return out
