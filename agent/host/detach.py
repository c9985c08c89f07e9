"""A detached helper process started, and waited for until it writes its info file: the run's
judge (agent/judge/control.py ``start_judge``) and its rendezvous store (agent/store/tcpstore.py
``start_store``) each start a process of a session of its own and wait for the small JSON file
that says where it listens.

:func:`start` is the one wait: the info file of an earlier process removed first; the new one's
file read only once it is whole (written by one rename), owned by this user and made
owner-only; a child that ends before it writes one is an error with its log's tail, and so is
a file that never appears (the child is then killed). :func:`spawn` is the plain detached
start (agent/slurm/host_step.py ``spawn`` starts through a Slurm job's host step where one
answers, else through this).

Standard library only; Python >= 3.8 (a host may run 3.8).
"""

import json
import os
import stat
import subprocess
import time

from .runfiles import log_tail

POLL = 0.05  # seconds between looks at the info file


def spawn(argv, data=None, out=None, env=None, cwd=None):
    """Start ``argv`` detached (a session of its own), ``data`` (bytes) on its stdin, its
    output appended to the file ``out`` (None: nowhere); its ``Popen``."""
    sink = open(out, "ab") if out else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else
                                subprocess.DEVNULL, stdout=sink, stderr=sink,
                                start_new_session=True, env=env, cwd=cwd)
    finally:
        if out:
            sink.close()
    if data is not None:
        proc.stdin.write(data)
        proc.stdin.close()
    return proc


def start(argv, info_path, what, data=None, out=None, env=None, cwd=None, timeout=30.0,
          ready=None, spawn=spawn):
    """Start ``argv`` detached (``spawn(argv, data, out, env, cwd)``, a ``Popen`` or one like
    it: ``pid``, ``poll``, ``kill``) and wait until it has written ``info_path`` (a JSON
    object) that ``ready(info, proc)`` takes (None: any); ``(info, proc)``. ``what`` names the
    process in errors.

    Raises RuntimeError: the child ended before it wrote its file (usually means a broken
    interpreter, spec or folder: the tail of its log ``out`` is in the message); no file within
    ``timeout`` seconds (the child is killed); the file belongs to another user (someone else
    can write the folder: refused, never read).
    """
    try:
        os.unlink(info_path)  # an earlier process's: never taken for the new one's
    except FileNotFoundError:
        pass
    proc = spawn(argv, data, out, env, cwd)
    deadline = time.monotonic() + timeout
    while True:
        ended = proc.poll() is not None
        info = read_info(info_path)  # after the poll: a child that wrote, then ended, counts
        if isinstance(info, dict) and (ready is None or ready(info, proc)):
            return info, proc
        if ended:
            raise RuntimeError("%s ended (exit code %s) before it wrote %s: %s" % (
                what, proc.returncode, os.path.basename(info_path),
                (log_tail(out) if out else "") or "it wrote no log"))
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL)
    proc.kill()
    raise RuntimeError("%s did not write %s within %.0f s (killed; its log: %s)" % (
        what, os.path.basename(info_path), timeout,
        (log_tail(out, 500) if out else "") or "empty"))


def read_info(path):
    """The JSON object in ``path``, or None while it is missing or not whole; made owner-only
    (0600) when it is not. RuntimeError for a file another user owns, or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None  # not there yet (or a link: refused by O_NOFOLLOW, read as none)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RuntimeError("%s is not a regular file: refused" % path)
        if st.st_uid != os.getuid():
            raise RuntimeError("%s belongs to uid %d, not to this user (uid %d): refused; "
                               "someone else can write its folder" % (path, st.st_uid,
                                                                       os.getuid()))
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read(1 << 20)
    finally:
        if fd is not None:
            os.close(fd)
    try:
        info = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    return info if isinstance(info, dict) else None
