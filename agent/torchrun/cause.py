"""Why a node's launcher (torchrun, accelerate's, DeepSpeed's) failed, in one line an operator
can act on.

In order of precision: torchrun's per-worker error file (only scripts decorated with torch's
``@record`` write one); else the rank torchrun reports as the first to fail and the last
exception in that rank's stderr (``rank 3: RuntimeError: credential rejected``); under
DeepSpeed, which reports no rank, the rank whose file of this start ended first with an
exception (:func:`rank_file_failed`); else the last exception the launcher itself printed,
named with the launcher (``deepspeed exited with code 1: ...``). Causes travel to the console and into ``state.json``,
so secret values of the run's environment are masked in them, as in every other output.
"""

import os
import re

from ..rules.mask import Masker
from ..host.runfiles import read_json

MAX_CAUSE = 500
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*")
# Once a script has called init_process_group, torch prints an uncaught exception with every
# line prefixed ``[rank3]: `` (torch/distributed/distributed_c10d.py, _distributed_excepthook)
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")


def find_error_files(log_dir, instance):
    """torchrun's per-worker error.json files of one torchrun start, oldest failure first."""
    found = []
    base = os.path.join(log_dir, instance)
    for root, _dirs, files in os.walk(base):
        if "error.json" in files:
            path = os.path.join(root, "error.json")
            data = read_json(path, {})
            msg = data.get("message", {})
            if isinstance(msg, dict):
                text = msg.get("message", "")
                ts = (msg.get("extraInfo") or {}).get("timestamp", "0")
            else:
                text, ts = str(msg), "0"
            parts = root.rstrip("/").split("/")
            try:
                local_rank = int(parts[-1])
                attempt = int(parts[-2].split("_")[1])
            except (ValueError, IndexError):
                local_rank, attempt = None, None
            found.append((int(ts) if str(ts).isdigit() else 0, local_rank, attempt, text, path))
    found.sort()
    return found


def last_exception(text):
    """The last exception line of a Python traceback in ``text`` (``Type: message``), or None.

    After the last ``Traceback (most recent call last):`` the first line that is not indented
    is the exception (frames and source lines are indented; a chained exception has its own
    later traceback). Without a traceback, the last line that names an exception type.
    Lines are read without torch's ``[rankN]: `` prefix.
    """
    lines = [_RANK_PREFIX.sub("", line, count=1) for line in text.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            for line in lines[i + 1:]:
                if line.strip() and not line[0].isspace():
                    return line.strip()
            break
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return line.strip()
    return None


def masked(text, secrets):
    """``text`` with every secret value replaced by ``****`` (agent/rules/mask.py's rules)."""
    return Masker(secrets).mask_text(text)


def one_line(text, secrets):
    text = masked(text, secrets).strip()
    return text if len(text) <= MAX_CAUSE else text[:MAX_CAUSE] + " ..."


def worker_failed(failure, stderr_text, secrets):
    """``rank R: <exception>`` for the worker torchrun reported first (see agent/torchrun_log)."""
    exc = last_exception(stderr_text or "")
    if exc is None:
        code = failure.get("exitcode")
        if failure.get("signal"):
            exc = "killed by %s" % failure["signal"]
        elif code is not None and code < 0:
            exc = "killed by signal %d" % -code
        else:
            exc = "exited with code %s and no exception in its stderr" % code
    return one_line("rank %s: %s" % (failure.get("rank"), exc), secrets)


def torchrun_failed(code, torchrun_text, started_workers, secrets, launcher="torchrun"):
    """The launcher (``launcher``: its name) ended badly with no worker to blame: what it (or
    its start) last said. Its console output is the node's torchrun.log, whichever it is."""
    what = last_exception(torchrun_text or "")
    if what is None:
        tail = [l for l in (torchrun_text or "").splitlines() if l.strip()][-1:]
        what = tail[0] if tail and tail[0].startswith("rankdeck:") else None
    head = "%s exited with code %s%s" % (launcher, code, "" if started_workers else
                                          " before starting workers")
    if what:
        return one_line("%s: %s" % (head, what), secrets)
    return one_line("%s; no worker error file (see the rank logs and torchrun.log)" % head
                    if started_workers else "%s; see torchrun.log" % head, secrets)


# DeepSpeed's launcher, when a rank exits non-zero (deepspeed/launcher/launch.py, 0.19):
# ``[...] [ERROR] [launch.py:259:sigkill_handler] ['python', '-u', 'train.py',
# '--local_rank=1', ...] exits with return code = 1``: the first rank to fail, by local rank
_DS_EXIT = re.compile(r"'--local_rank=(\d+)'.*exits with return code = (-?\d+)")


def rank_file_failed(paths, launcher_text, secrets, tail_bytes=64 << 10):
    """``{"message": "rank R: <exception>", "rank": R}`` for the rank that failed first under
    DeepSpeed's launcher. ``paths``: {global rank: its one file of stdout and stderr
    (``--enable_each_rank_log``)} of this node's start; ``launcher_text``: the launcher's
    console, which names the first failure by local rank (the node's global ranks in order).
    Without that line, the file that ended with an exception first, by its last write (the
    others fail later, when their peer is gone). None when no file holds an exception
    (usually means the ranks were killed from outside)."""
    found = {}
    for rank, path in paths.items():
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - tail_bytes))
                exc = last_exception(f.read().decode("utf-8", "replace"))
            written = os.stat(path).st_mtime
        except OSError:
            continue
        if exc is not None:
            found[rank] = (written, exc)
    named = None
    for line in (launcher_text or "").splitlines():
        m = _DS_EXIT.search(line)
        if m and int(m.group(1)) < len(paths):
            named = sorted(paths)[int(m.group(1))]
            code = m.group(2)
    if named is not None and named not in found:
        return {"message": one_line("rank %s: exited with code %s and no exception in its "
                                    "output" % (named, code), secrets), "rank": named}
    if named is None and not found:
        return None
    rank = named if named is not None else min(found, key=lambda r: found[r])
    return {"message": one_line("rank %s: %s" % (rank, found[rank][1]), secrets), "rank": rank}
