"""Code to the hosts: a host workdir as agent/sync/place.py places files into it.

Paths from the console are checked here before anything is written, and what rankdeck placed
is recorded in ``<workdir>/.rankdeck/placed.json``::

    {"version": 1, "tree": H, "files": {path: {"sha256", "size", "mode", "mtime_ns", "own"}},
     "dirs": [folders rankdeck created]}

Safety: paths from the console are refused when absolute, empty, with ``.``/``..`` parts, with a
NUL, inside ``.git``/``.rankdeck``, or when a folder on the way is a symlink leading out of the
workdir. The login home itself is never a sync workdir (:func:`sync_root`). A commit works on
folder descriptors opened part by part without following links (:meth:`Workdir.folder`), one
commit at a time (:class:`WorkdirLock`). Only files marked ``own`` (rankdeck wrote them) are
ever removed, and only while their content is what rankdeck wrote (:func:`remove_stale`): a
file the user made or changed on the host stays.

Standard library only; Python >= 3.8.
"""

import errno
import hashlib
import json
import os
import stat
import threading

from ..host.paths import home, host_path
from ..wire.sync import SKIP_PARTS

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS
    fcntl = None

RECORD_VERSION = 1


class SyncError(Exception):
    """A sync request that cannot be done; ``kind`` says what sort.

    ``path``: a path from the console that is not a plain relative path inside the workdir
    (usually means a bug or a hostile console). ``sha``: a file's bytes do not hash to what the
    manifest says (usually means the file changed on the laptop while it was being sent).
    ``conflict``: the host has a folder where the tree has a file, or the reverse. ``usage``:
    a malformed request (a session the agent does not know usually means the connection
    dropped mid-transfer: sync again).
    """

    def __init__(self, message, kind="sync"):
        super().__init__(message)
        self.kind = kind


# -- paths ----------------------------------------------------------------------------------
def expand_workdir(workdir):
    """``~``, ``~/x`` and relative workdirs against the login home, as scp and rsync read them
    (agent/host/paths.py; ``str`` because the value comes from the console, untrusted)."""
    return host_path(str(workdir or "~"))


def sync_root(workdir):
    """The workdir a sync may place files into; refused (``path``) when it is the login home
    itself, where a tree would mix with the user's dotfiles and keys."""
    root = expand_workdir(workdir)
    if os.path.realpath(root) == os.path.realpath(home()):
        raise SyncError("refused workdir %s: the login home itself (a tree there mixes with "
                        "your dotfiles); set the host's workdir: to a folder such as ~/proj"
                        % root, "path")
    return root


def check_relpath(path):
    """Refuse any path that is not a plain relative path under the workdir."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise SyncError("refused path %r: not a relative file path" % (path,), "path")
    if path.startswith("/"):
        raise SyncError("refused path %r: absolute" % path, "path")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise SyncError("refused path %r: empty, '.' or '..' part" % path, "path")
        if part in SKIP_PARTS:
            raise SyncError("refused path %r: rankdeck never writes into %s/" % (path, part),
                            "path")
    return parts


def _inside(real_root, path):
    return path == real_root or path.startswith(real_root.rstrip("/") + "/")


NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
NOFOLLOW_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO never hangs


class Workdir:
    """A host workdir, and the folders in it already checked not to lead out of it.

    Each folder is resolved once (a tree of thousands of files has tens of folders). The last
    part of a path may be a symlink: rename replaces the link, never writes through it.

    A commit works through :meth:`folder` instead: an open descriptor of each folder, reached
    one part at a time without following a symlink, so a folder swapped for a link after the
    checks cannot send a rename, chmod or unlink out of the workdir. Call :meth:`close` after.
    """

    def __init__(self, root):
        self.root = root
        self.real = os.path.realpath(root)
        self._checked = {}  # folder (relative) -> inside the workdir?
        self._fds = {}  # folder (relative, "" the workdir) -> an open descriptor of it

    def _folder_inside(self, sub):
        ok = self._checked.get(sub)
        if ok is None:
            ok = _inside(self.real, os.path.realpath(os.path.join(self.root, sub)))
            self._checked[sub] = ok
        return ok

    def path(self, rel):
        """The absolute path of ``rel``; refused when a folder on the way leaves the workdir."""
        check_relpath(rel)
        if not self._folder_inside(rel.rpartition("/")[0]):
            raise SyncError("refused path %r: a folder on its way is a symlink out of the "
                            "workdir" % rel, "path")
        return os.path.join(self.root, rel)

    def folder(self, sub, created=None):
        """An open descriptor of the folder ``sub`` ("" the workdir), made (and noted in
        ``created``) when missing and ``created`` is a set. Raises SyncError ``path`` when a
        part is a symlink out of the workdir, ``conflict`` when it is a file; OSError when
        missing and not to be made."""
        fd = self._fds.get(sub)
        if fd is not None:
            return fd
        if not sub:
            fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY)
        else:
            parent, _, name = sub.rpartition("/")
            fd = self._open_child(self.folder(parent, created), sub, name, created)
        self._fds[sub] = fd
        return fd

    def _open_child(self, parent_fd, sub, name, created):
        try:
            return os.open(name, NOFOLLOW_DIR, dir_fd=parent_fd)
        except FileNotFoundError:
            if created is None:
                raise
            try:
                os.mkdir(name, 0o777, dir_fd=parent_fd)  # the umask (serve: 077) decides
                created.add(sub)
            except FileExistsError:
                pass  # made meanwhile: open what is there, with the same checks
            return self._open_child(parent_fd, sub, name, None)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            raise SyncError("the host has a file %s where the tree has a folder" % sub,
                            "conflict") from None
        real = os.path.realpath(os.path.join(self.real, sub))
        if real == self.real or not _inside(self.real, real):
            raise SyncError("refused path %r: a symlink out of the workdir" % sub, "path")
        # a link that stays inside: the folder it names, reached without links
        fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in os.path.relpath(real, self.real).split("/"):
                nxt = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except OSError:
            os.close(fd)
            raise SyncError("refused path %r: its folder changed while being placed" % sub,
                            "conflict") from None
        return fd

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


# -- the record of what was placed ----------------------------------------------------------
def record_path(root):
    return os.path.join(root, ".rankdeck", "placed.json")


def read_record(root):
    try:
        with open(record_path(root)) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return {"version": RECORD_VERSION, "tree": None, "files": {}, "dirs": []}
    if not isinstance(rec, dict) or rec.get("version") != RECORD_VERSION:
        return {"version": RECORD_VERSION, "tree": None, "files": {}, "dirs": []}
    rec.setdefault("files", {})
    rec.setdefault("dirs", [])
    return rec


def write_record(root, rec):
    path = record_path(root)
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
    with open(tmp, "w") as f:
        f.write(json.dumps(rec, separators=(",", ":")))  # dumps: the C encoder, dump is not
    os.replace(tmp, path)


def regular_stat(full):
    """lstat of a plain file, or None (missing, a folder, a symlink...)."""
    try:
        st = os.lstat(full)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def same_stat(st, frec):
    """Does a file still look as recorded (size, mtime, mode)? rsync's quick check."""
    return (st is not None and st.st_size == frec.get("size")
            and st.st_mtime_ns == frec.get("mtime_ns") and (st.st_mode & 0o777) == frec.get("mode"))


def signature(st):
    """What a commit compares with what its plan saw: kind, inode, size, mtime, mode."""
    if st is None:
        return None
    return [stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode & 0o777]


def lstat_or_none(full):
    try:
        return os.lstat(full)
    except (FileNotFoundError, NotADirectoryError):
        return None


def stat_record(st, sha, own):
    """A placed file's entry in the record, from its lstat."""
    return {"sha256": sha, "size": st.st_size, "mode": st.st_mode & 0o777,
            "mtime_ns": st.st_mtime_ns, "own": own}


# -- a commit: one at a time; what it may remove --------------------------------------------
class WorkdirLock:
    """Serialises commits into one workdir (two consoles, or hosts sharing a home over NFS)."""

    def __init__(self, root):
        self.path = os.path.join(root, ".rankdeck", "sync.lock")
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # closing drops the lock


def fd_sha256(fd):
    """The sha256 (hex) of what an open file holds from its offset on."""
    h = hashlib.sha256()
    while True:
        block = os.read(fd, 1 << 20)
        if not block:
            return h.hexdigest()
        h.update(block)


def remove_stale(workdir, rec, keep_paths):
    """Remove files rankdeck wrote that the tree no longer has, if still as it wrote them."""
    removed, kept = [], []
    for rel, frec in sorted(rec["files"].items()):
        if rel in keep_paths:
            continue
        if not frec.get("own"):
            continue  # the user's file, merely identical to the tree's once: never removed
        sub, _, name = rel.rpartition("/")
        try:
            check_relpath(rel)
            folder = workdir.folder(sub)
            fd = os.open(name, NOFOLLOW_FILE, dir_fd=folder)
        except (OSError, SyncError):
            continue  # gone already, or not a plain file any more: nothing of ours to remove
        try:
            st = os.fstat(fd)
            ours = stat.S_ISREG(st.st_mode) and (same_stat(st, frec)
                                                 or fd_sha256(fd) == frec.get("sha256"))
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            continue
        if ours:
            try:
                os.unlink(name, dir_fd=folder)
                removed.append(rel)
            except FileNotFoundError:
                pass
        else:
            kept.append(rel)  # changed on the host since: the user's now
    return removed, kept
