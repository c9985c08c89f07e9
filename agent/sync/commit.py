"""Code to the hosts, host side: a sync's last op, ``commit``, puts its staged files in place.

Under the workdir's lock (agent/sync/workdir.py WorkdirLock) the commit first looks again at every
path the plan looked at (agent/sync/place.py): anything changed since - another console's sync into
the same workdir - fails it with ``conflict`` before a file moves. It then works on folder
descriptors opened part by part without following links (rename, chmod and unlink by
``dir_fd``, chmod by ``fchmod``), so a folder or file swapped for a symlink meanwhile cannot
send a write out of the workdir; each staged file is renamed into place (a reader sees the
old file or the new one), files rankdeck placed before that the tree no longer has are
removed while still as written, and the record (``.rankdeck/placed.json``) is written.

Standard library only; Python >= 3.8.
"""

import errno
import os
import shutil
import stat

from .workdir import (
    NOFOLLOW_DIR, NOFOLLOW_FILE, RECORD_VERSION, SyncError, Workdir, WorkdirLock, lstat_or_none,
    read_record, remove_stale, signature, stat_record, write_record
)


def conflict_text(paths, what):
    """``what: a, b, c`` naming the first ten of ``paths`` (and how many more)."""
    shown = ", ".join(sorted(paths)[:10])
    more = " and %d more" % (len(paths) - 10) if len(paths) > 10 else ""
    return "%s: %s%s" % (what, shown, more)


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
        with WorkdirLock(tr.root):
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
        raise SyncError(conflict_text(changed, "changed on the host since this sync looked "
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
    removed, kept = remove_stale(workdir, rec, files)
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
        return stat_record(os.stat(name, dir_fd=folder, follow_symlinks=False), sha, own)
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
    return stat_record(st, sha, own)
