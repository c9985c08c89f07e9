"""Code to the hosts, host side: place the console's tree of files into a workdir.

The console sends a manifest (path, size, mode, sha256 of every file) and the tree hash over
it; this module answers which files it needs, takes their contents in bounded chunks, and then
puts them in place. What rankdeck placed is recorded in ``<workdir>/.rankdeck/placed.json``::

    {"version": 1, "tree": H, "files": {path: {"sha256", "size", "mode", "mtime_ns", "own"}},
     "dirs": [folders rankdeck created]}

Ops (each takes the request's ``args`` and returns the reply's ``data``; a refusal raises
:class:`SyncError` with a ``kind``):

- :func:`check` ``{workdir, tree}`` -> ``{"same", "workdir"}``: an unchanged tree costs this one
  round trip. "Same" means the record's tree is ``tree`` and every recorded file still has the
  size, mtime and mode it was placed with (a stat each, no reading).
- :func:`plan` ``{session, workdir, tree, entries, more}`` -> ``{"more": true}`` or ``{"need":
  [indexes into the manifest], "bytes"}``. ``entries`` (``[path, size, mode, sha256]``) may come
  in several messages; the last (``more`` false) must hash to ``tree``.
- :func:`put` ``{session, pieces: [[index, offset, base64], ...]}`` -> ``{"done": [indexes]}``:
  file contents, staged under ``.rankdeck/sync/<session>/``; a file whose last byte arrived is
  checked against its sha256 at once.
- :func:`commit` ``{session}`` -> ``{"placed", "removed", "kept"}``: every staged file renamed
  into place (temp + rename: a reader sees the old file or the new one), modes set, files that
  rankdeck placed before and that the tree no longer has removed, the record written.
- :func:`abort` ``{session}`` -> ``{}``: forget a transfer and its staged files.

Safety: paths from the console are refused when absolute, empty, with ``.``/``..`` parts, with a
NUL, inside ``.git``/``.rankdeck``, or when a folder on the way is a symlink leading out of the
workdir. Only files marked ``own`` (rankdeck wrote them) are ever removed, and only while their
content is what rankdeck wrote: a file the user made or changed on the host stays. A host file
that already has the tree's content is taken as it is (recorded, not ``own``). Any other host
file (or link, or folder) where the tree has a file is a ``conflict``, named in the refusal,
unless rankdeck placed it (or recorded it and it is unchanged since): never overwritten, never
marked as placed. The login home itself is never a sync workdir. Folders are removed only when
rankdeck created them and they are empty. Modes: 0644, 0755, and owner-only 0600, 0700 as the
laptop has them.

Races: the commit takes ``.rankdeck/sync.lock`` and looks again at every path the plan looked
at; anything changed since (another console's sync into the workdir) fails it with
``conflict`` before a file moves. It then works on folder descriptors opened part by part
without following links (rename, chmod and unlink by ``dir_fd``, chmod by ``fchmod``), so a
folder or file swapped for a symlink meanwhile cannot send a write out of the workdir. A
transfer holds a lock in its staging folder while it lives, so another console's sweep of old
staging folders leaves a long upload alone.

This file is over 450 lines until the split into agent/workdir.py and agent/sync_wire.py
(branch agent-split) lands.

Standard library only; Python >= 3.8.
"""

import base64
import binascii
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import threading
import time

from .hostpaths import home, host_path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS
    fcntl = None

RECORD_VERSION = 1
# One message on the wire, encoded: plan and put messages stay under this.
MAX_MESSAGE = 1 << 20
# File bytes in one put message: base64 makes 4 of every 3, and the rest is JSON framing.
MAX_PUT_BYTES = (MAX_MESSAGE - 64 * 1024) // 4 * 3
SKIP_PARTS = (".git", ".rankdeck")
STALE_STAGING = 600.0  # seconds before a staging folder no transfer owns is swept
STAGING_LOCK = "lock"  # in a staging folder: held (flock) by the transfer that owns it
KEEP_FAILED = 16  # failed transfers remembered per connection (their puts still in flight)
SESSION_RE = re.compile(r"^[0-9a-f]{8,64}$")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")


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


# -- the tree hash (the console uses this same function) ------------------------------------
def tree_hash(entries):
    """sha256 over the sorted ``(path, size, mode, sha256)`` entries of a manifest."""
    h = hashlib.sha256()
    for path, size, mode, sha in sorted(entries, key=lambda e: e[0]):
        h.update(path.encode("utf-8", "surrogateescape"))
        h.update(("\0%d\0%o\0%s\n" % (size, mode, sha)).encode("ascii"))
    return h.hexdigest()


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                return h.hexdigest()
            h.update(block)


MODES = (0o644, 0o755, 0o600, 0o700)


def norm_mode(st_mode):
    """What a manifest keeps of a file's mode: executable or not, and owner-only when others
    cannot read it (a 0600 key file stays 0600 on the host, never 0644)."""
    mode = 0o755 if st_mode & 0o111 else 0o644
    return mode if st_mode & 0o004 else mode & 0o700


# -- paths ----------------------------------------------------------------------------------
def expand_workdir(workdir):
    """``~``, ``~/x`` and relative workdirs against the login home, as scp and rsync read them
    (agent/hostpaths.py; ``str`` because the value comes from the console, untrusted)."""
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


class Workdir(object):
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


def _stat_record(st, sha, own):
    return {"sha256": sha, "size": st.st_size, "mode": st.st_mode & 0o777,
            "mtime_ns": st.st_mtime_ns, "own": own}


# -- ops ------------------------------------------------------------------------------------
def check(args):
    """Is the workdir's placed tree ``args["tree"]``, untouched since? One stat per file."""
    root = sync_root(args.get("workdir"))
    rec = read_record(root)
    same = bool(args.get("tree")) and rec.get("tree") == args.get("tree")
    if same:
        for rel, frec in rec["files"].items():
            if not same_stat(regular_stat(os.path.join(root, rel)), frec):
                same = False
                break
    return {"same": same, "workdir": root}


class Transfer(object):
    """One sync in progress on this connection: the manifest, what is needed, what arrived."""

    def __init__(self, session, root, tree):
        self.session = session
        self.root = root
        self.tree = tree
        self.entries = []
        self.need = None  # {index: bytes received}, once the plan is complete
        self.unchanged = {}  # {index: record} of files the plan found as recorded
        self.seen = {}  # {index: signature} of each path as the plan found it (None: absent)
        self.overwrite = {}  # {index: record} of files placed before that the tree replaces
        self.done = set()
        self.lock = threading.Lock()
        self.staging = os.path.join(root, ".rankdeck", "sync", session)
        self.staging_lock = None  # an fd holding STAGING_LOCK in staging while this lives

    def hold_staging(self):
        """Make the staging folder, locked: another console's sweep leaves it be."""
        os.makedirs(self.staging, exist_ok=True)
        fd = os.open(os.path.join(self.staging, STAGING_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.staging_lock = fd

    def release(self):
        fd, self.staging_lock = self.staging_lock, None
        if fd is not None:
            os.close(fd)  # closing drops the lock

    def staged(self, index):
        return os.path.join(self.staging, str(index))


class Transfers(object):
    """The transfers of one serve process (one connection), by session id; thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_session = {}
        self.failed = {}  # session -> (message, kind) of a transfer that failed, newest few

    def get(self, session):
        with self.lock:
            tr = self.by_session.get(session)
            failed = self.failed.get(session)
        if failed is not None:  # a put still in flight when another failed: the same cause
            raise SyncError(*failed)
        if tr is None:
            raise SyncError("no sync transfer %r here (the connection dropped mid-transfer?): "
                            "sync again" % (session,), "usage")
        return tr

    def fail(self, session, err):
        """End a transfer for ``err`` (its staging is the caller's to remove); the puts of it
        still in flight, on other threads, raise the same error rather than an OSError."""
        with self.lock:
            tr = self.by_session.pop(session, None)
            if tr is not None:
                tr.release()
            self.failed.setdefault(session, (str(err), err.kind))  # the first cause wins
            while len(self.failed) > KEEP_FAILED:
                del self.failed[next(iter(self.failed))]

    def pop(self, session):
        with self.lock:
            tr = self.by_session.pop(session, None)
        if tr is not None:
            tr.release()
        return tr

    def sessions(self):
        with self.lock:
            return set(self.by_session)


def _check_entry(entry):
    if not (isinstance(entry, list) and len(entry) == 4):
        raise SyncError("malformed manifest entry %r" % (entry,), "usage")
    path, size, mode, sha = entry
    check_relpath(path)
    if not isinstance(size, int) or size < 0 or mode not in MODES \
            or not (isinstance(sha, str) and SHA_RE.match(sha)):
        raise SyncError("malformed manifest entry %r" % (entry,), "usage")
    return path, size, mode, sha


def _sweep_staging(root, live):
    """Staging folders of transfers that died with their connection (none of ours, old)."""
    base = os.path.join(root, ".rankdeck", "sync")
    try:
        names = os.listdir(base)
    except OSError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(base, name)
        try:
            old = now - os.lstat(path).st_mtime > STALE_STAGING
        except OSError:
            continue
        if name not in live and old:
            _sweep_unless_held(path)


def _sweep_unless_held(path):
    """Remove a staging folder unless its transfer (in another serve) still holds its lock."""
    try:
        fd = os.open(os.path.join(path, STAGING_LOCK), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        fd = None  # no lock file: a transfer that died before it made one
    try:
        if fd is not None and fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return  # a long upload of another console: its staging stays
        shutil.rmtree(path, ignore_errors=True)
    finally:
        if fd is not None:
            os.close(fd)


def plan(transfers, args):
    """Take (part of) the manifest; on its last part answer which files the host needs."""
    session = args.get("session")
    if not (isinstance(session, str) and SESSION_RE.match(session)):
        raise SyncError("malformed sync session %r" % (session,), "usage")
    with transfers.lock:
        tr = transfers.by_session.get(session)
        if tr is None:
            tr = Transfer(session, sync_root(args.get("workdir")), args.get("tree"))
            transfers.by_session[session] = tr
    if tr.need is not None:
        raise SyncError("sync %s already has its plan" % session, "usage")
    try:
        for entry in args.get("entries") or []:
            tr.entries.append(_check_entry(entry))
    except SyncError:
        transfers.pop(session)
        raise
    if args.get("more"):
        return {"more": True}
    try:
        return _plan_complete(transfers, tr)
    except BaseException:
        transfers.pop(session)
        raise


def _plan_complete(transfers, tr):
    if tree_hash(tr.entries) != tr.tree:
        raise SyncError("the manifest does not hash to its tree %s (cut short?)" % tr.tree,
                        "usage")
    if len({e[0] for e in tr.entries}) != len(tr.entries):
        raise SyncError("the manifest names a path twice", "usage")
    os.makedirs(os.path.join(tr.root, ".rankdeck", "sync"), exist_ok=True)
    workdir = Workdir(tr.root)
    _sweep_staging(tr.root, transfers.sessions())
    rec = read_record(tr.root)
    need = {}
    conflicts = []
    for i, (path, size, _mode, sha) in enumerate(tr.entries):
        full = workdir.path(path)
        frec = rec["files"].get(path)
        st = lstat_or_none(full)
        tr.seen[i] = signature(st)
        if st is not None and not stat.S_ISREG(st.st_mode):
            conflicts.append(path)  # a folder, a link, ...: the host's, never replaced
            continue
        if frec and frec.get("sha256") == sha and same_stat(st, frec):
            tr.unchanged[i] = frec
            continue
        if st is not None and st.st_size == size and file_sha256(full) == sha:
            continue  # the host already has these bytes: commit records them as they are
        if st is not None:
            if not (frec and (frec.get("own") or same_stat(st, frec))):
                conflicts.append(path)  # the host's own file (or changed since recorded)
                continue
            tr.overwrite[i] = frec
        need[i] = 0
    if conflicts:
        raise SyncError(_conflict_text(conflicts, "the host has %d path(s) rankdeck did not "
                                       "place that differ from the tree" % len(conflicts))
                        + "; move them aside (or delete them) on the host and sync again",
                        "conflict")
    tr.hold_staging()
    tr.need = need
    return {"need": sorted(need), "bytes": sum(tr.entries[i][1] for i in need)}


def _conflict_text(paths, what):
    shown = ", ".join(sorted(paths)[:10])
    more = " and %d more" % (len(paths) - 10) if len(paths) > 10 else ""
    return "%s: %s%s" % (what, shown, more)


def put(transfers, args):
    """Write pieces of needed files into staging; check each completed file's sha256."""
    tr = transfers.get(args.get("session"))
    if tr.need is None:
        raise SyncError("sync %s: contents before the plan" % tr.session, "usage")
    pieces = args.get("pieces") or []
    decoded = []
    total = 0
    for piece in pieces:
        try:
            index, offset, text = piece
            data = base64.b64decode(text.encode("ascii"), validate=True)
        except (ValueError, TypeError, binascii.Error):
            raise SyncError("malformed piece in sync %s" % tr.session, "usage") from None
        total += len(data)
        if index not in tr.need:
            raise SyncError("sync %s: file %r was not asked for" % (tr.session, index), "usage")
        size = tr.entries[index][1]
        if not isinstance(offset, int) or offset < 0 or offset + len(data) > size:
            raise SyncError("sync %s: piece beyond the end of %s" % (
                tr.session, tr.entries[index][0]), "usage")
        decoded.append((index, offset, data))
    if total > MAX_PUT_BYTES:
        raise SyncError("sync %s: %d bytes in one message, at most %d"
                        % (tr.session, total, MAX_PUT_BYTES), "usage")
    try:
        os.utime(tr.staging)  # a long upload stays young for any sweep without flock
        return {"done": _write_pieces(transfers, tr, decoded)}
    except (OSError, SyncError):
        with transfers.lock:
            failed = tr.session in transfers.failed
        if failed:  # this or another put failed the transfer: clear what racing puts left,
            shutil.rmtree(tr.staging, ignore_errors=True)
            transfers.get(tr.session)  # and say its first cause
        raise


def _write_pieces(transfers, tr, decoded):
    """Write decoded pieces into staging; the indexes of files they completed (each checked)."""
    done = []
    for index, offset, data in decoded:
        transfers.get(tr.session)  # failed by another put meanwhile: write nothing more
        fd = os.open(tr.staged(index), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        with tr.lock:
            tr.need[index] += len(data)
            complete = tr.need[index] >= tr.entries[index][1] and index not in tr.done
            if complete:
                tr.done.add(index)
        if complete:
            path, _size, _mode, sha = tr.entries[index]
            got = file_sha256(tr.staged(index))
            if got != sha:
                err = SyncError("%s: received bytes hash to %s, the manifest says %s (changed "
                                "on the laptop while sending?); nothing was placed"
                                % (path, got[:12], sha[:12]), "sha")
                transfers.fail(tr.session, err)
                raise err
            done.append(index)
    return done


class _WorkdirLock(object):
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


def _place(tr, index, staging_fd, folder_fd, name):
    """Rename the staged file over ``name`` in ``folder_fd``, its mode set first (across file
    systems: copied next to it first). Neither step follows a symlink."""
    staged = str(index)
    fd = os.open(staged, NOFOLLOW_FILE, dir_fd=staging_fd)
    try:
        os.fchmod(fd, tr.entries[index][2])
    finally:
        os.close(fd)
    try:
        os.rename(staged, name, src_dir_fd=staging_fd, dst_dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = "%s.rankdeck-%s.tmp" % (name, tr.session)
        with open(os.open(staged, NOFOLLOW_FILE, dir_fd=staging_fd), "rb") as src, \
                open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                             dir_fd=folder_fd), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            os.fchmod(dst.fileno(), tr.entries[index][2])
        os.rename(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)


def _fd_sha256(fd):
    h = hashlib.sha256()
    while True:
        block = os.read(fd, 1 << 20)
        if not block:
            return h.hexdigest()
        h.update(block)


def _remove_stale(workdir, rec, keep_paths):
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
                                                 or _fd_sha256(fd) == frec.get("sha256"))
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


def commit(transfers, args):
    """Put every staged file in place, remove what rankdeck placed and the tree dropped."""
    tr = transfers.get(args.get("session"))
    if tr.need is None:
        raise SyncError("sync %s: commit before the plan" % tr.session, "usage")
    missing = [tr.entries[i][0] for i in tr.need if i not in tr.done]
    if missing:
        raise SyncError("sync %s: %d file(s) not received, e.g. %s"
                        % (tr.session, len(missing), missing[0]), "usage")
    workdir = Workdir(tr.root)
    try:
        with _WorkdirLock(tr.root):
            return _commit_locked(tr, workdir)
    finally:
        workdir.close()
        transfers.pop(tr.session)
        shutil.rmtree(tr.staging, ignore_errors=True)


def _look_again(tr, workdir, rec):
    """Under the lock: is every path as the plan saw it? Another sync into this workdir (a
    second launch) may have committed since; then this one must not place or trust anything."""
    changed = []
    for i, (path, _size, _mode, _sha) in enumerate(tr.entries):
        frec = tr.unchanged.get(i)
        if signature(lstat_or_none(workdir.path(path))) != tr.seen[i] or (
                frec is not None and rec["files"].get(path) != frec):
            changed.append(path)
    if changed:
        raise SyncError(_conflict_text(changed, "changed on the host since this sync looked "
                                       "(another sync into this workdir?)")
                        + "; nothing was placed: sync again", "conflict")


def _commit_locked(tr, workdir):
    root = tr.root
    rec = read_record(root)
    _look_again(tr, workdir, rec)
    created = set(rec["dirs"])
    staging_fd = os.open(tr.staging, NOFOLLOW_DIR)
    try:
        files = {}
        for i, entry in enumerate(tr.entries):
            files[entry[0]] = _commit_one(tr, workdir, rec, created, staging_fd, i)
    finally:
        os.close(staging_fd)
    removed, kept = _remove_stale(workdir, rec, files)
    dirs = []
    wanted = {"/".join(p.split("/")[:k]) for p in files for k in range(1, p.count("/") + 1)}
    for sub in sorted(created, key=lambda d: -d.count("/")):
        parent, _, name = sub.rpartition("/")
        try:
            folder = workdir.folder(parent)
        except (OSError, SyncError):
            continue  # gone (or no longer a plain folder): nothing to note
        if sub not in wanted:
            try:
                os.rmdir(name, dir_fd=folder)
                continue
            except OSError:
                pass  # not empty (the user's files), or gone: keep noting it
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                dirs.append(sub)
        except OSError:
            pass
    write_record(root, {"version": RECORD_VERSION, "tree": tr.tree, "files": files,
                        "dirs": sorted(dirs)})
    return {"placed": len(tr.need), "removed": removed, "kept": kept, "workdir": root}


def _commit_one(tr, workdir, rec, created, staging_fd, i):
    """Place (or re-mode, or take as it is) entry ``i``; its record."""
    path, _size, mode, sha = tr.entries[i]
    frec = tr.unchanged.get(i)
    if frec is not None and frec.get("mode") == mode:
        return frec  # as the plan saw it, and looked at again under the lock
    sub, _, name = path.rpartition("/")
    folder = workdir.folder(sub, created)
    if i in tr.need:
        _place(tr, i, staging_fd, folder, name)
        old = tr.overwrite.get(i)
        own = old is None or bool(old.get("own"))  # the host's file stays the host's
        return _stat_record(os.stat(name, dir_fd=folder, follow_symlinks=False), sha, own)
    old = rec["files"].get(path)
    own = bool(old and old.get("own") and old.get("sha256") == sha)
    try:
        fd = os.open(name, NOFOLLOW_FILE, dir_fd=folder)
    except OSError:
        raise SyncError("%s changed on the host during the sync: sync again" % path,
                        "conflict") from None
    try:
        st = os.fstat(fd)
        if signature(st) != tr.seen[i]:
            raise SyncError("%s changed on the host during the sync: sync again" % path,
                            "conflict")
        if (st.st_mode & 0o777) != mode:
            os.fchmod(fd, mode)
            st = os.fstat(fd)
    finally:
        os.close(fd)
    return _stat_record(st, sha, own)


def abort(transfers, args):
    """Forget a transfer; its staged files go, the workdir is as before."""
    tr = transfers.pop(args.get("session"))
    if tr is not None:
        shutil.rmtree(tr.staging, ignore_errors=True)
    return {}


OPS = ("sync_check", "sync_plan", "sync_put", "sync_commit", "sync_abort")


def request(transfers, op, args):
    """Run one sync op by its protocol name; what serve's dispatch calls."""
    if op == "sync_check":
        return check(args)
    fn = {"sync_plan": plan, "sync_put": put, "sync_commit": commit, "sync_abort": abort}[op]
    return fn(transfers, args)
