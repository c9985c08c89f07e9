"""Code to the hosts, laptop side: the manifest of a folder, and sending it to one node.

:func:`build_manifest` lists what ``rankdeck launch --sync DIR`` sends:

- DIR inside a git work tree: what ``git ls-files --cached --others --exclude-standard`` lists
  (tracked files, and untracked ones that are not ignored); tracked files deleted from the
  work tree are left out;
- otherwise every file that DIR's .gitignore files do not match (console/launch/gitignore.py says
  which patterns are understood).

``.git/`` and ``.rankdeck/`` are never sent. Symlinks are not sent: each is left out with a
warning in ``Manifest.skipped`` (a link's target may lie outside the tree or not exist on the
host; copy what it points at into the tree if the host needs it). Git submodules and nested
repositories are left out the same way. A file keeps its executable bit and whether it is
owner-only: 0755, 0644, or 0700, 0600 for a file others cannot read (the host's copy stays as
private as the laptop's).

Files that look like secrets (:func:`looks_secret`: ``.env``, ``.env.*``, ``id_`` and a name
without a dot as SSH keys are named, ``*.pem``, ``*.key``, ``.netrc``) are left out even when
git lists them, each with a warning in ``Manifest.skipped``, unless an ``include`` pattern
(``--sync-include``, a .gitignore-style pattern) names them.

:func:`sync_node` sends a manifest to one node's agent (agent/sync/place.py) through ``call(op,
args)``, the link's request function: one round trip when the node already has the tree.
No Textual, no SSH here.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import secrets
import stat
import subprocess
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from agent.wire.sync import (MAX_MESSAGE, MAX_PUT_BYTES, SKIP_PARTS, file_sha256, norm_mode,
                             tree_hash)

from . import gitignore

WINDOW = 4  # put messages in flight per node: keeps the pipe full without piling up memory


class SyncError(Exception):
    """The tree cannot be listed or sent; usually means DIR is not a folder or git failed."""


@dataclass(frozen=True)
class Entry:
    """One file of the tree: ``path`` relative to it, ``/``-separated."""

    path: str
    size: int
    mode: int
    sha256: str

    def wire(self) -> list:
        return [self.path, self.size, self.mode, self.sha256]


@dataclass
class Manifest:
    """What DIR holds to send; ``tree`` is the hash the run record keeps."""

    root: str
    entries: list[Entry]
    source: str  # "git" or "gitignore"
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)
    tree: str = ""

    def __post_init__(self):
        self.entries.sort(key=lambda e: e.path)
        self.tree = tree_hash([e.wire() for e in self.entries])

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)


# -- listing --------------------------------------------------------------------------------
def _excluded(rel: str) -> bool:
    return any(part in SKIP_PARTS for part in rel.split("/"))


# .env files, SSH private keys (id_rsa, id_ed25519; id_map.json is code), PEM and .key files,
# and the login passwords of .netrc (_netrc on Windows)
SECRET_NAME = re.compile(r"^(?:\.env(?:\..*)?|id_[^./]+|.*\.pem|.*\.key|[._]netrc)$", re.DOTALL)
SECRET_WHY = "looks like a secret, not sent (--sync-include PATTERN sends it)"


def looks_secret(rel: str) -> bool:
    """Is ``rel`` a file name that usually holds a secret (left out unless included)?"""
    return SECRET_NAME.match(rel.rsplit("/", 1)[-1]) is not None


def include_patterns(include) -> list[gitignore.Pattern]:
    """``--sync-include`` patterns, read as .gitignore lines. Raises SyncError for a pattern
    that matches nothing ever (blank, a comment)."""
    out = []
    for text in include or ():
        pat = gitignore.parse_line(text)
        if pat is None:
            raise SyncError("--sync-include %r: not a pattern" % text)
        out.append(pat)
    return out


def git_files(root: str) -> list[str] | None:
    """What git lists under ``root`` (relative paths), or None if ``root`` is not in a work tree.

    Raises SyncError when git is there but fails (usually means a damaged repository).
    """
    try:
        inside = subprocess.run(["git", "-C", root, "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True)
    except FileNotFoundError:
        return None  # no git on this laptop: the .gitignore rules still apply
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    done = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                           "--exclude-standard"], capture_output=True)
    if done.returncode != 0:
        raise SyncError("git ls-files in %s failed: %s"
                        % (root, done.stderr.decode("utf-8", "replace").strip()))
    # an unmerged path is listed once per stage
    return list(dict.fromkeys(os.fsdecode(p) for p in done.stdout.split(b"\0") if p))


def walk_files(root: str, skipped: list) -> list[str]:
    """Every file under ``root`` that its .gitignore files do not match; symlinks skipped."""
    out: list[str] = []
    patterns: list[gitignore.Pattern] = []

    def visit(rel_dir: str, depth_patterns: list) -> None:
        full_dir = os.path.join(root, rel_dir) if rel_dir else root
        pats = depth_patterns
        try:
            with open(os.path.join(full_dir, ".gitignore"), encoding="utf-8",
                      errors="surrogateescape") as f:
                pats = depth_patterns + gitignore.parse(f.read(), rel_dir)
        except OSError:
            pass
        with os.scandir(full_dir) as it:
            children = sorted(it, key=lambda d: d.name)
        for d in children:
            rel = rel_dir + "/" + d.name if rel_dir else d.name
            if d.name in SKIP_PARTS:
                continue
            is_dir = d.is_dir(follow_symlinks=False)
            if gitignore.ignored(pats, rel, is_dir):
                continue
            if d.is_symlink():
                skipped.append((rel, "symlink, not sent"))
            elif is_dir:
                visit(rel, pats)
            elif d.is_file(follow_symlinks=False):
                out.append(rel)
            else:
                skipped.append((rel, "not a regular file"))

    visit("", patterns)
    return out


class HashCache:
    """sha256 of the tree's files from the last manifest, trusted while a file's stat is the same.

    The stat (size, mtime, ctime, inode) is git's index check. A file whose mtime is within
    RACY_SECONDS of when it was hashed is hashed again next time: it may have changed again in
    the same clock tick (git's "racy clean" problem). Kept in ``$XDG_CACHE_HOME/rankdeck/sync/``;
    a missing or damaged cache only costs the hashing.
    """

    RACY_SECONDS = 2.0

    def __init__(self, root: str):
        base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        name = hashlib.sha256(os.fsencode(root)).hexdigest()[:24] + ".json"
        self.path = os.path.join(base, "rankdeck", "sync", name)
        self.now_ns = time.time_ns()
        try:
            with open(self.path) as f:
                self.old = json.load(f)
        except (OSError, ValueError):
            self.old = {}
        self.new: dict[str, list] = {}

    def sha256(self, rel: str, full: str, st: os.stat_result) -> str:
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        hit = self.old.get(rel)
        if isinstance(hit, list) and hit[:4] == key:
            sha = hit[4]
        else:
            sha = file_sha256(full)
        if self.now_ns - max(st.st_mtime_ns, st.st_ctime_ns) > self.RACY_SECONDS * 1e9:
            self.new[rel] = key + [sha]
        return sha

    def save(self) -> None:
        folder = os.path.dirname(self.path)
        try:  # the paths of the user's trees: theirs alone (0700 folder, 0600 file)
            os.makedirs(folder, 0o700, exist_ok=True)
            os.chmod(folder, 0o700)  # one an older rankdeck made 0755 too
            tmp = "%s.%d.tmp" % (self.path, os.getpid())
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(json.dumps(self.new, separators=(",", ":")))
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written is only slower next time


def build_manifest(root: str, cache: bool = True, include=()) -> Manifest:
    """List and hash what ``--sync root`` sends (see the module docstring). Blocking: run it
    off the event loop. ``cache``: reuse the hashes of files unchanged since the last manifest
    (HashCache). ``include``: ``--sync-include`` patterns, the secret-looking files to send.
    Raises SyncError when ``root`` is not a folder or a pattern is empty."""
    root = os.path.abspath(os.path.expanduser(root))
    if not os.path.isdir(root):
        raise SyncError("--sync %s: not a folder" % root)
    included = include_patterns(include)
    hashes = HashCache(root) if cache else None
    skipped: list[tuple[str, str]] = []
    listed = git_files(root)
    source = "git"
    if listed is None:
        listed, source = walk_files(root, skipped), "gitignore"
    entries = []
    for rel in listed:
        if rel.endswith("/"):
            skipped.append((rel, "nested git repository, not sent"))
            continue
        if _excluded(rel):
            continue
        if looks_secret(rel) and not gitignore.ignored(included, rel, False):
            skipped.append((rel, SECRET_WHY))
            continue
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue  # tracked but deleted from the work tree
        if stat.S_ISLNK(st.st_mode):
            skipped.append((rel, "symlink, not sent"))
        elif stat.S_ISDIR(st.st_mode):
            skipped.append((rel, "git submodule, not sent"))
        elif not stat.S_ISREG(st.st_mode):
            skipped.append((rel, "not a regular file"))
        else:
            sha = hashes.sha256(rel, full, st) if hashes else file_sha256(full)
            entries.append(Entry(rel, st.st_size, norm_mode(st.st_mode), sha))
    if hashes:
        hashes.save()
    return Manifest(root, entries, source, skipped)


# -- sending --------------------------------------------------------------------------------
@dataclass
class SyncProgress:
    """Where one node's sync stands; ``phase`` is checking, sending, done or unchanged."""

    phase: str = "checking"
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0


@dataclass
class SyncResult:
    """One node's sync: ``same`` when the node already had the tree (one round trip)."""

    tree: str
    same: bool
    workdir: str = ""
    files_sent: int = 0
    bytes_sent: int = 0
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # placed once, changed on the host: left


Call = Callable[[str, dict], Awaitable[dict]]


def _plan_messages(manifest: Manifest, base: dict):
    """The manifest cut into plan requests that each encode under MAX_MESSAGE."""
    budget = MAX_MESSAGE - 4096 - len(json.dumps(base))
    chunk: list[list] = []
    used = 0
    for e in manifest.entries:
        size = len(json.dumps(e.wire())) + 1
        if chunk and used + size > budget:
            yield chunk
            chunk, used = [], 0
        chunk.append(e.wire())
        used += size
    yield chunk


def _put_messages(manifest: Manifest, need: list[int]):
    """(pieces, bytes) per put request, each under MAX_PUT_BYTES of file data.

    Files are read as they are sent; a file changed since it was hashed fails the agent's
    sha256 check, and nothing is placed.
    """
    pieces: list[list] = []
    used = 0
    for index in need:
        entry = manifest.entries[index]
        with open(os.path.join(manifest.root, entry.path), "rb") as f:
            offset = 0
            while True:
                room = MAX_PUT_BYTES - used - 64 * (len(pieces) + 1)
                if room <= 0:
                    yield pieces, used
                    pieces, used = [], 0
                    continue
                data = f.read(min(room, entry.size - offset)) if offset < entry.size else b""
                if offset + len(data) < entry.size and not data:
                    raise SyncError("%s shrank while being sent" % entry.path)
                pieces.append([index, offset, base64.b64encode(data).decode("ascii")])
                used += len(data)
                offset += len(data)
                if offset >= entry.size:
                    break
    if pieces:
        yield pieces, used


async def sync_node(call: Call, manifest: Manifest, workdir: str,
                    progress: Callable[[SyncProgress], None] | None = None,
                    window: int = WINDOW) -> SyncResult:
    """Make ``workdir`` on one node hold ``manifest``'s files; only what differs is sent.

    ``call(op, args)`` is the node's request function (``NodeLink.request``); agent refusals
    come out of it as its own exceptions. A failed transfer is aborted on the node, which
    then has its workdir as before.
    """
    prog = SyncProgress(files_total=len(manifest.entries), bytes_total=manifest.bytes)
    report = progress or (lambda p: None)
    report(prog)
    checked = await call("sync_check", {"workdir": workdir, "tree": manifest.tree})
    if checked.get("same"):
        prog.phase, prog.files_total, prog.bytes_total = "unchanged", 0, 0
        report(prog)
        return SyncResult(manifest.tree, True, checked.get("workdir", workdir))
    session = secrets.token_hex(8)
    base = {"session": session, "workdir": workdir, "tree": manifest.tree}
    try:
        chunks = list(_plan_messages(manifest, base))
        for i, chunk in enumerate(chunks):
            planned = await call("sync_plan", dict(base, entries=chunk,
                                                   more=i < len(chunks) - 1))
        need = planned["need"]
        prog.phase, prog.files_total, prog.bytes_total = "sending", len(need), planned["bytes"]
        report(prog)
        await _send(call, session, manifest, need, prog, report, window)
        done = await call("sync_commit", {"session": session})
    except BaseException:
        try:
            await asyncio.shield(call("sync_abort", {"session": session}))
        except Exception:
            pass  # the connection is gone: the agent forgets the transfer with it
        raise
    prog.phase = "done"
    report(prog)
    return SyncResult(manifest.tree, False, done.get("workdir", workdir), len(need),
                      prog.bytes_total, done.get("removed", []), done.get("kept", []))


async def _send(call: Call, session: str, manifest: Manifest, need: list[int],
                prog: SyncProgress, report, window: int) -> None:
    """Put requests, ``window`` in flight at once; the first failure stops the rest."""
    in_flight: set[asyncio.Task] = set()

    async def one(pieces, nbytes):
        reply = await call("sync_put", {"session": session, "pieces": pieces})
        prog.files_done += len(reply.get("done", []))
        prog.bytes_done += nbytes
        report(prog)

    try:
        for pieces, nbytes in _put_messages(manifest, need):
            if len(in_flight) >= window:
                finished, in_flight = await asyncio.wait(
                    in_flight, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()
            in_flight.add(asyncio.ensure_future(one(pieces, nbytes)))
        if in_flight:
            finished, in_flight = await asyncio.wait(in_flight)
            for task in finished:
                task.result()
    finally:
        for task in in_flight:
            task.cancel()


async def sync_hosts(calls: dict[str, Call], manifest: Manifest, workdirs: dict[str, str],
                     report: Callable[[dict[str, SyncProgress]], None] | None = None) -> dict:
    """:func:`sync_node` on every node at once: ``{node: SyncResult or the exception}``.

    ``calls`` and ``workdirs`` are per node; ``report`` gets every node's progress (a dict
    in the order of ``calls``) after each change. One node's failure never stops the others.
    """
    progress = {name: SyncProgress() for name in calls}

    def one(name: str):
        def on_progress(prog: SyncProgress) -> None:
            progress[name] = prog
            if report is not None:
                report(progress)
        return sync_node(calls[name], manifest, workdirs[name], on_progress)

    names = list(calls)
    results = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
    return dict(zip(names, results))


def progress_line(nodes: dict[str, SyncProgress]) -> str:
    """``sync: node0 12/40 files 3.1/8.0 MB · node1 unchanged`` (plain text, one line)."""
    parts = []
    for name, p in nodes.items():
        if p.phase in ("unchanged", "checking"):
            parts.append("%s %s" % (name, p.phase))
        else:
            parts.append("%s %d/%d files %.1f/%.1f MB%s" % (
                name, p.files_done, p.files_total, p.bytes_done / 1e6, p.bytes_total / 1e6,
                " done" if p.phase == "done" else ""))
    return "sync: " + " \u00b7 ".join(parts)
