"""Follow torchrun's per-rank log files live, by byte offset.

torchrun ``--log-dir D --redirects 3`` writes
``D/<rdzv-id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log`` (accelerate's launcher
too: it runs torchrun's); DeepSpeed's ``--enable_each_rank_log D`` writes
``D/<time>_rank<R>.log`` (see ``_RANK_FILE``). A restart caused by a
node joining or leaving reuses ``attempt_<n>`` and deletes the folder first, so files are
opened as soon as they appear and kept open: a deleted file is still read to its end, and a
new file at the same path (another inode) is followed as a new file.

Each followed file gets a file id (``fid``). :meth:`LogFollower.poll` returns journal records:
one ``file`` record when a file's rank is known, then ``data`` records with the file's bytes
and their source offset. Data is cut at the last line end (``\n``, or the ``\r`` a progress
bar redraws with) so records hold whole lines, except when a line grows past ``MAX_PENDING``
bytes without one (then it is passed on in pieces) and a progress bar drawn after a ``\r``
(passed on as it is written: the next ``\r`` may be a step away). Such a cut never falls
inside a secret (``keep_whole``, the host's ``Masker.safe_cut``): the host masks each record
on its own. A turn reads a worker's stdout just before its stderr and hands the stderr's
records over first (``_reading_order``): a line on stdout comes after what the worker wrote
to stderr before it.

With a :class:`agent.host.watch.Watch` the follower watches the log dir's folders (and the files
given to :meth:`LogFollower.add`) and a turn with nothing written costs a read of the inotify
queue: the folders are rescanned when their entries change (and every ``RESCAN`` seconds,
in case), the files read when something was written. Without one it scans every
``SCAN_EVERY`` seconds and reads every file every turn.
"""

import errno
import os
import re
import time

from .watch import FILE_EVENTS, STRUCTURE

MAX_PENDING = 64 * 1024
MAX_RECORD = 64 * 1024  # bytes of log data in one journal record (one protocol message)
READ_SIZE = 1 << 20
RANK_WAIT = 5.0  # seconds to wait for a worker's RANK before announcing the file without it
# seconds to wait for a known rank's worker to show itself (its pid) before announcing the
# file without it: torchrun opens a worker's files before the worker has exec'd with its
# environment, and a pid found later would never reach the console (the GPU panel's match)
PID_WAIT = 1.0
SCAN_EVERY = 0.1  # seconds between scans of the log dir without a watch
RESCAN = 2.0  # with a watch: a scan this often even if no folder reported a change

_ATTEMPT = re.compile(r"attempt_(\d+)$")
# DeepSpeed's launcher (``--enable_each_rank_log D``, deepspeed/launcher/launch.py) writes each
# rank's stdout and stderr into one file ``D/<YYYYmmddHHMMSS>_rank<R>.log``: the global rank
# is in the name, the time names the launcher's start (a restart is a new one)
_RANK_FILE = re.compile(r"(\d{14})_rank(\d+)\.log$")


def rank_files(log_dir, names):
    """{global rank: path} of the DeepSpeed per-rank files among ``names`` in ``log_dir``."""
    out = {}
    for name in names:
        named = _RANK_FILE.match(name)
        if named:
            out[int(named.group(2))] = os.path.join(log_dir, name)
    return out


class FollowedFile:
    __slots__ = ("fid", "path", "fd", "inode", "offset", "pending", "pending_offset", "meta",
                 "announced", "seen", "gone")

    def __init__(self, fid, path, fd, inode, meta):
        self.fid = fid
        self.path = path
        self.fd = fd
        self.inode = inode
        self.offset = 0  # bytes read from the file so far
        self.pending = b""  # read but not yet emitted (an unfinished line)
        self.pending_offset = 0
        self.meta = meta
        self.announced = False
        self.seen = time.monotonic()
        self.gone = False  # unlinked or replaced: close at EOF


class LogFollower:
    """Follows a torchrun log dir plus any extra files (torchrun's own console output).

    ``resolve_rank(attempt, local_rank)`` returns the global rank of that worker, or
    ``(rank, extra)`` with more fields for the file record (world size; ``pid`` None: the
    worker is not seen yet, asked again for up to PID_WAIT), or None when it is not known
    (yet). ``ignore`` names torchrun start folders not to follow (a node's earlier supervisor
    followed them already). ``keep_whole(data, end)``: where, at or before ``end``,
    ``data`` may be cut inside a line (agent/rules/mask.py ``Masker.safe_cut``).
    """

    def __init__(self, log_dir, resolve_rank, first_fid=1, ignore=(), watch=None,
                 keep_whole=lambda data, end: end):
        self.log_dir = log_dir
        self.keep_whole = keep_whole
        self.watch = watch  # agent/host/watch.py, or None: poll
        self._busy = True  # a file waits for its rank or its end: read next turn, changed or not
        self.resolve_rank = resolve_rank
        self.ignore = set(ignore)
        self.files = {}  # path -> FollowedFile (the live one at that path)
        self.closing = []  # replaced/deleted files still being read to EOF
        self.next_fid = first_fid
        self._last_scan = float("-inf")  # never: the first poll scans (monotonic starts at boot)

    def add(self, path, **meta):
        """Follow one more file whose metadata is known (announced at once)."""
        ff = self._open(path, dict(meta, path=path))
        if ff is not None:
            ff.announced = None  # announce with the given meta, no rank lookup
            self._watch(path, FILE_EVENTS)
        return ff

    def _watch(self, path, mask=None):
        """Watch one more folder or file; past the user's inotify limit, go back to polling."""
        if self.watch is None:
            return
        try:
            if mask is None:
                self.watch.add(path)
            else:
                self.watch.add(path, mask)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):  # nothing to watch there
                return
            self.watch.close()
            self.watch = None

    def wake_on(self, path, signals=()):
        """Writes under ``path`` (a folder or a file) and ``signals`` end a :meth:`wait` too,
        with a watch (main thread only)."""
        self._watch(path)
        if self.watch is not None:
            self.watch.wake_on_signals(*signals)

    def wait(self, seconds, idle):
        """Sleep ``seconds`` between turns (lines gather into one read); with a watch and
        nothing written meanwhile, on until something is or ``idle`` seconds have passed."""
        time.sleep(seconds)
        if self.watch is not None and not self._busy and idle > seconds:
            self.watch.wait(idle - seconds)

    def _open(self, path, meta):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        ff = FollowedFile(self.next_fid, path, fd, os.fstat(fd).st_ino, meta)
        self.next_fid += 1
        self.files[path] = ff
        return ff

    def scan(self):
        """Look for new and replaced files under the log dir (each folder is watched before it
        is listed, so an entry made in between is reported)."""
        self._watch(self.log_dir)
        try:
            instances = os.listdir(self.log_dir)
        except OSError:
            return
        for inst in instances:
            if inst in self.ignore:
                continue
            named = _RANK_FILE.match(inst)
            if named:
                self._check(os.path.join(self.log_dir, inst), named.group(1), 0, None,
                            "stdout", rank=int(named.group(2)))
                continue
            inst_dir = os.path.join(self.log_dir, inst)
            self._watch(inst_dir)
            try:
                attempts = os.listdir(inst_dir)
            except OSError:
                continue
            for att in attempts:
                m = _ATTEMPT.match(att)
                if not m:
                    continue
                att_dir = os.path.join(inst_dir, att)
                self._watch(att_dir)
                try:
                    ranks = os.listdir(att_dir)
                except OSError:
                    continue
                for lr in ranks:
                    if not lr.isdigit():
                        continue
                    self._watch(os.path.join(att_dir, lr))
                    for stream in ("stdout", "stderr"):
                        path = os.path.join(att_dir, lr, stream + ".log")
                        self._check(path, inst, int(m.group(1)), int(lr), stream)

    def _check(self, path, inst, attempt, local_rank, stream, rank=None):
        """Follow the file at ``path`` if it is new (or replaced); ``rank``: its global
        rank when its name says it (announced at once, no lookup)."""
        try:
            inode = os.stat(path).st_ino
        except OSError:
            old = self.files.get(path)
            if old is not None:
                old.gone = True
            return
        old = self.files.get(path)
        if old is not None:
            if old.inode == inode:
                return
            old.gone = True
            self.closing.append(old)
        meta = {"instance": inst, "attempt": attempt, "local_rank": local_rank,
                "stream": stream, "path": path}
        if rank is not None:
            meta["rank"] = rank
        ff = self._open(path, meta)
        if ff is not None and rank is not None:
            ff.announced = None  # announce with the rank its name gave
            if self.watch is not None:  # a flat file: no folder of its own to watch
                self._watch(path, FILE_EVENTS)

    def poll(self, final=False):
        """Read what is new; returns journal records ``[(meta, data), ...]``."""
        now = time.monotonic()
        if self.watch is not None and not final:
            changed = self.watch.drain()
            stale = now - self._last_scan >= RESCAN
            if not (changed or stale or self._busy):
                return []  # nothing written, nothing waiting: an idle turn reads no file
            due = stale or changed & STRUCTURE
        else:
            due = final or now - self._last_scan >= SCAN_EVERY
        if due:
            self._last_scan = now
            self.scan()
        records, held = [], {}  # held: a worker's stdout records, until its stderr's are in
        for ff in _reading_order(list(self.files.values()) + self.closing):
            worker = _worker_of(ff)
            if ff.meta.get("stream") == "stdout":
                self._announce_and_read(ff, held.setdefault(worker, []), now, final)
            else:
                self._announce_and_read(ff, records, now, final)
                records += held.pop(worker, ())
        for recs in held.values():
            records += recs
        still = []
        for ff in self.closing:
            if ff.fd is not None:
                still.append(ff)
        self.closing = still
        # a deleted file is no folder's entry any more (no event tells of its writes), and a
        # file waiting for its rank must be looked at again: read those every turn
        self._busy = bool(still) or any(ff.announced is not True or ff.gone
                                        for ff in self.files.values())
        return records

    def _announce_and_read(self, ff, records, now, final):
        """``ff``'s ``file`` record once its rank is known (or waited for long enough),
        then what is new in it, into ``records``."""
        if not ff.announced:
            if ff.announced is None:
                ff.announced = True
                records.append((dict(ff.meta, k="file", f=ff.fid,
                                     rank=ff.meta.get("rank")), b""))
            else:
                rank = self.resolve_rank(ff.meta["attempt"], ff.meta["local_rank"])
                extra = {}
                if isinstance(rank, tuple):
                    rank, extra = rank
                age = now - ff.seen
                if not final and (rank is None and age < RANK_WAIT or
                                  "pid" in extra and extra["pid"] is None and age < PID_WAIT):
                    return  # data waits in the file until we know whose it is
                extra = {k: v for k, v in extra.items() if v is not None}
                ff.announced = True
                records.append((dict(ff.meta, k="file", f=ff.fid, rank=rank, **extra), b""))
        self._read(ff, records, final)

    def _read(self, ff, records, final):
        if ff.fd is None:
            return
        chunks = []
        while True:
            try:
                chunk = os.read(ff.fd, READ_SIZE)
            except OSError:
                chunk = b""
            if not chunk:
                break
            chunks.append(chunk)
            if len(chunk) < READ_SIZE:
                break
        if chunks:
            if not ff.pending:
                ff.pending_offset = ff.offset
            data = ff.pending + b"".join(chunks)
            ff.offset += len(data) - len(ff.pending)
            # A bare \r ends a piece too: a tqdm bar redraws with \r and may print no \n for
            # a whole run, and the metrics parser needs its steps as they come.
            cut = _line_end(data, 0, len(data))
            if final:
                cut = len(data)
            elif len(data) - cut > MAX_PENDING or _drawn(data, cut):
                # what follows may finish a secret: not that
                cut = max(cut, self.keep_whole(data, len(data)))
            start = 0
            while start < cut:  # records of at most MAX_RECORD bytes, cut at a line end if any
                end = min(cut, start + MAX_RECORD)
                if end < cut:
                    nl = _line_end(data, start, end)
                    end = nl if nl > start else _after(start, self.keep_whole(data, end), end)
                records.append(({"k": "data", "f": ff.fid, "o": ff.pending_offset,
                                 "ts": time.time()}, data[start:end]))
                ff.pending_offset += end - start
                start = end
            ff.pending = data[cut:]
        elif final and ff.pending:
            records.append(({"k": "data", "f": ff.fid, "o": ff.pending_offset,
                             "ts": time.time()}, ff.pending))
            ff.pending_offset += len(ff.pending)
            ff.pending = b""
        if ff.gone and not chunks:
            os.close(ff.fd)
            ff.fd = None
            if self.files.get(ff.path) is ff:
                del self.files[ff.path]

    def close(self):
        for ff in list(self.files.values()) + self.closing:
            if ff.fd is not None:
                os.close(ff.fd)
                ff.fd = None
        self.files = {}
        self.closing = []
        if self.watch is not None:
            self.watch.close()
            self.watch = None


def _line_end(data, start, end):
    """Just after the last ``\n`` or ``\r`` of ``data[start:end]``; 0 if there is none."""
    return max(data.rfind(b"\n", start, end), data.rfind(b"\r", start, end)) + 1


def _worker_of(ff):
    """The worker whose output ``ff`` is: torchrun's worker (its start, attempt and local
    rank: its stdout and its stderr), or the file alone (torchrun's own log, a DeepSpeed rank's
    one file)."""
    meta = ff.meta
    if meta.get("local_rank") is None:
        return ("file", ff.fid)
    return (meta.get("instance"), meta.get("attempt"), meta.get("local_rank"))


def _reading_order(files):
    """``files`` in the order a turn reads them: each worker's stdout just before its stderr.

    A worker writes its stderr and its stdout in one order, a turn reads them one after the
    other: a stdout line read before the stderr means that everything the worker wrote to
    stderr before the line is in that read of stderr, so :meth:`LogFollower.poll` hands over
    the stderr's records first. A loss dict (stdout) so comes after the progress bar
    (stderr) that was in force when it was written, in one turn (agent/formats/hf.py); read the
    other way round, a bar and its dict written between the two reads would split across two
    turns, the dict first."""
    first = {}
    for i, ff in enumerate(files):
        first.setdefault(_worker_of(ff), i)
    return sorted(files, key=lambda ff: (first[_worker_of(ff)],
                                         ff.meta.get("stream") != "stdout"))


def _drawn(data, cut):
    """Whether ``data[cut:]``, what follows its last line end, is a progress record already
    drawn: a redraw's ``\r`` before it and something printed. A bar is drawn with a leading
    \r (``\r 3%|▎ | 1/30 [...]``) and ended by nothing until the next redraw, so it is passed on
    as it is written, not when the next one starts: the step it shows is in force now
    (agent/formats/hf.py pairs a loss with it). Blanks alone wait for their \r: a bar being
    cleared (tqdm writes the blanks and the \r that ends them apart) is one clear, whole."""
    return cut > 0 and data[cut - 1:cut] == b"\r" and not data[cut:].isspace()


def _after(start, cut, end):
    """``cut`` if it leaves something to pass on after ``start``, else ``end``: a secret
    longer than a record is cut all the same."""
    return cut if cut > start else end
