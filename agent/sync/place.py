"""Code to the hosts, host side: place the console's tree of files into a workdir.

The console sends a manifest (path, size, mode, sha256 of every file) and the tree hash over
it (agent/wire/sync.py, the format both sides share); this module answers which files it
needs, takes their contents in bounded chunks, and then puts them in place. The workdir's
side - paths refused before anything is written, folders reached without following links,
the record of what rankdeck placed (``.rankdeck/placed.json``), which files a commit may
remove - is agent/sync/workdir.py.

Ops (each takes the request's ``args`` and returns the reply's ``data``; a refusal raises
:class:`SyncError` with a ``kind``):

- :func:`check` ``{workdir, tree}`` -> ``{"same", "workdir", "tree"}`` (the tree placed
  last): an unchanged tree costs this one round trip. "Same" means the record's tree is ``tree`` and every recorded file still has the
  size, mtime and mode it was placed with (a stat each, no reading).
- :func:`plan` ``{session, workdir, tree, entries, more}`` -> ``{"more": true}`` or ``{"need":
  [indexes into the manifest], "bytes"}``. ``entries`` (``[path, size, mode, sha256]``) may come
  in several messages; the last (``more`` false) must hash to ``tree``.
- :func:`put` ``{session, pieces: [[index, offset, base64], ...]}`` -> ``{"done": [indexes]}``:
  file contents, staged under ``.rankdeck/sync/<session>/``; a file whose last byte arrived is
  checked against its sha256 at once.
- :func:`commit` ``{session}`` -> ``{"placed", "removed", "kept"}`` (agent/sync/commit.py):
  every staged file renamed into place (temp + rename: a reader sees the old file or the new
  one), modes set, files that rankdeck placed before and that the tree no longer has removed,
  the record written.
- :func:`abort` ``{session}`` -> ``{}``: forget a transfer and its staged files.

Safety (agent/sync/workdir.py): only plain relative paths inside the workdir, never the login
home itself, are written; only files rankdeck wrote, still as it wrote them, are ever removed.
A host file that already has the tree's content is taken as it is (recorded, not ``own``).
Any other host file (or link, or folder) where the tree has a file is a ``conflict``, named in
the refusal, unless rankdeck placed it (or recorded it and it is unchanged since): never
overwritten, never marked as placed. Folders are removed only when rankdeck created them and
they are empty. Modes: 0644, 0755, and owner-only 0600, 0700 as the laptop has them.

Races: the commit (agent/sync/commit.py) takes ``.rankdeck/sync.lock`` and looks again at
every path the plan looked at before a file moves, and places files without following links.
A transfer holds a lock in its staging folder while it lives, so another console's sweep of
old staging folders leaves a long upload alone.

Standard library only; Python >= 3.8.
"""

import base64
import binascii
import os
import shutil
import stat
import threading
import time

from .commit import commit, conflict_text
from ..wire.sync import MAX_PUT_BYTES, MODES, SESSION_RE, SHA_RE, file_sha256, tree_hash
from .workdir import (
    SyncError, Workdir, check_relpath, lstat_or_none, read_record, regular_stat, same_stat,
    signature, sync_root
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS
    fcntl = None

STALE_STAGING = 600.0  # seconds before a staging folder no transfer owns is swept
STAGING_LOCK = "lock"  # in a staging folder: held (flock) by the transfer that owns it
KEEP_FAILED = 16  # failed transfers remembered per connection (their puts still in flight)


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
    # the tree placed last (None: none): the deep check names a node whose code differs
    return {"same": same, "workdir": root, "tree": rec.get("tree")}


class Transfer:
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


class Transfers:
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
        raise SyncError(conflict_text(conflicts, "the host has %d path(s) rankdeck did not "
                                       "place that differ from the tree" % len(conflicts))
                        + "; move them aside (or delete them) on the host and sync again",
                        "conflict")
    tr.hold_staging()
    tr.need = need
    return {"need": sorted(need), "bytes": sum(tr.entries[i][1] for i in need)}


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
