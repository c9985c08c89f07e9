"""Wake a polling loop when the files it reads change: Linux inotify through ctypes.

The supervisor (rank log files) and ``serve`` (the journal) used to wake ten times a second
to find, most of the time, nothing new: half of the agent's CPU at a chatty trainer's pace
(docs/BENCHMARKS.md, "The whole agent"). With a :class:`Watch` they sleep until the kernel
says a watched directory or file changed, or until their next periodic duty. Where inotify
cannot be had (not Linux, no libc through ctypes, ``fs.inotify.max_user_instances`` or
``max_user_watches`` reached, or ``RANKDECK_WATCH=poll``) :func:`open_watch` returns None and
the callers poll at their paced rate (agent/host/pace.py), as before. Standard library only.
"""

import ctypes
import os
import select
import signal
import struct
import threading

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000

#: Events that change which files exist (a rescan is due), as opposed to bytes appended.
STRUCTURE = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
             | IN_MOVE_SELF | IN_Q_OVERFLOW | IN_IGNORED)
#: What a watched directory reports: its entries coming and going, and writes to its files.
DIR_EVENTS = IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF \
    | IN_MOVE_SELF
FILE_EVENTS = IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF

ENV = "RANKDECK_WATCH"  # "poll": never use inotify (tests force the fallback with it)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)


def _libc():
    # the program's own symbols (libc among them), as agent/host/procs.py does: find_library
    # would run ldconfig, ~5 ms of every agent start (each connection starts serve)
    libc = ctypes.CDLL(None, use_errno=True)
    for name in ("inotify_init1", "inotify_add_watch", "inotify_rm_watch"):
        getattr(libc, name)  # AttributeError: a libc without inotify
    libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
    return libc


class Watch:
    """One inotify instance: :meth:`add` paths, :meth:`wait` for a change, :meth:`drain` it.

    Raises OSError when the kernel refuses an instance or a watch (usually means the user's
    inotify limits are reached: fall back to polling).
    """

    def __init__(self):
        self._libc = _libc()
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, "inotify_init1: %s" % os.strerror(err))
        self.fd = fd
        self._wake_r, self._wake_w = os.pipe()
        for end in (self._wake_r, self._wake_w):
            os.set_blocking(end, False)
        self._lock = threading.Lock()  # add/rm from a request thread, drain from the loop
        self._signals = False  # this pipe is the interpreter's signal wakeup fd

    def fileno(self):
        return self.fd

    def add(self, path, mask=DIR_EVENTS):
        """Watch ``path``; the watch descriptor (the same one again for a watched inode)."""
        with self._lock:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, "inotify_add_watch %s: %s" % (path, os.strerror(err)))
        return wd

    def remove(self, wd):
        with self._lock:
            self._libc.inotify_rm_watch(self.fd, wd)

    def wake(self):
        """Make a :meth:`wait` in another thread return now."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # the pipe is full: a wake is pending anyway
            pass

    def wake_on_signals(self, *signums):
        """Signals end a :meth:`wait` too: the interpreter writes each one to the wake pipe
        (``signal.set_wakeup_fd``; main thread only). ``signums`` without a handler of their
        own (SIGCHLD: a child ended) get one that does nothing, so that they are delivered."""
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._signals = True
        for signum in signums:
            if signal.getsignal(signum) in (signal.SIG_DFL, None):
                signal.signal(signum, _delivered)

    def wait(self, timeout):
        """Block until a watched path changed, :meth:`wake` was called, or ``timeout`` s."""
        try:
            ready, _w, _x = select.select([self.fd, self._wake_r], [], [], max(0.0, timeout))
        except (OSError, ValueError):  # closed under us: the caller is ending
            return False
        return bool(ready)

    def drain(self):
        """The OR of the masks of the events since the last drain (0: nothing changed); wake
        bytes are drained too."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass
        mask = 0
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return mask
            except OSError:
                return mask | IN_Q_OVERFLOW  # cannot tell what changed: everything may have
            if not buf:
                return mask
            pos = 0
            while pos + _HEADER.size <= len(buf):
                _wd, ev, _cookie, size = _HEADER.unpack_from(buf, pos)
                mask |= ev
                pos += _HEADER.size + size

    def close(self):
        if self._signals:
            self._signals = False
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:  # not the main thread: the process is ending anyway
                pass
        for fd in (self.fd, self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd = -1


def _delivered(_signum, _frame):
    """A signal whose only job is to end a wait (the wakeup fd did that)."""


def open_watch():
    """A :class:`Watch`, or None where inotify cannot be had (then poll)."""
    if os.environ.get(ENV, "").strip().lower() == "poll":
        return None
    try:
        return Watch()
    except (OSError, AttributeError):
        return None
