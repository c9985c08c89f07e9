"""The small files of a run folder: JSON written atomically and read leniently, a log's tail.

``state.json`` and ``store.json`` are read by `serve` while a supervisor or the store may be
rewriting them, so they are replaced in one rename and a reader that finds half a file (or
none) gets the default instead of an error.
"""

import json
import os


def write_json_atomic(path, obj):
    """Write ``obj`` as JSON to ``path`` through a temporary file and one rename."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text(path, text):
    """Write ``text`` to ``path`` (replacing it) through a temporary file and one rename."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def file_id(path):
    """``(inode, mtime_ns, size)`` of ``path``, None when it is missing: another value once
    the file was replaced or rewritten (a reader's cue to read it again)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_json(path, default=None):
    """The JSON in ``path``, or ``default`` when it is missing or not (yet) valid JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def log_tail(path, size=2000):
    """The last ``size`` bytes of a log file as text ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
