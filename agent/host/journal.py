"""A node's run journal: one append-only file the supervisor writes and every `serve` reads.

Why a journal and not torchrun's log files directly: torchrun deletes an ``attempt_<n>``
folder when a membership change restarts its workers (docs/FACTS.md, "torchrun on CPU
(gloo), 4 nodes x 1 process, small MLP"), and global ranks move between nodes across
restarts. The supervisor follows the live files (keeping them open, so even a deleted file
is read to its end), tags every chunk with the file it came from, and appends it here with
the metrics parsed from it and the run's events. A console then needs one number per node -
the journal offset it has seen - to resume after a reconnect and receive every line exactly
once.

Record layout (read by agent/wire/protocol.py ``split_records``: a console reads the records a
``jbytes`` message brings as the journal holds them): an ASCII header ``<meta_len>
<data_len>\\n``, then ``meta_len`` bytes of JSON (an object with ``k``, the record kind), then
``data_len`` raw bytes (log data; empty for other kinds). Kinds: ``file`` (a followed file
and its rank), ``data`` (bytes of a file from source offset ``o``), ``metric``, ``ckpt``,
``event``.

Scrolling back: the writer also keeps ``journal.idx``, the start offset of a record every
``INDEX_EVERY`` bytes (one short line per MiB), so that :func:`read_back` can read a window
that ends at any offset without reading the journal from its start.
"""

import json
import os

from ..wire.protocol import (
    MAX_HEADER, JournalCorrupt, is_meta, record_header, split_records as split,
    whole_records as whole
)

READ_CHUNK = 1 << 20
META_WINDOW = 4096  # bytes read at a record's header to walk it and its meta, not its data
INDEX_EVERY = 1 << 20
BACK_SCAN = 32 << 20  # bytes of journal one read_back may look through

# Made once: json.dumps/json.loads with options build an encoder per call, a third of the
# cost of a record's small meta (a record a rank a turn at a trickle; docs/BENCHMARKS.md).
_encode_meta = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode
_decode_meta = json.JSONDecoder().decode
_KIND_AT = b'{"k":"'  # how every meta JournalWriter writes begins: its kind comes first


class JournalWriter:
    """Appends records; one writer per journal (the node's supervisor)."""

    def __init__(self, path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.size = os.fstat(self._fd).st_size  # a restarted supervisor appends
        self._index_fd = os.open(path + ".idx", os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        marks = read_index(path, self.size + 1)
        self._indexed = marks[-1] if marks else 0

    def append(self, meta, data=b""):
        self.append_many([(meta, data)])

    def append_many(self, records):
        parts = []
        size = self.size
        for meta, data in records:
            if size - self._indexed >= INDEX_EVERY:  # this record starts a new index window
                os.write(self._index_fd, b"%d\n" % size)
                self._indexed = size
            body = _encode_meta(meta).encode("ascii")
            header = b"%d %d\n" % (len(body), len(data))
            parts.append(header)
            parts.append(body)
            parts.append(data)
            size += len(header) + len(body) + len(data)
        if parts:
            # One write for all so a reader never sees a header without its body for long.
            os.write(self._fd, b"".join(parts))
            self.size = size

    def close(self):
        os.close(self._fd)
        os.close(self._index_fd)


def parse(buf, base_offset=0):
    """Split a buffer into whole records.

    Returns ``(records, consumed)``: a list of ``(meta, data, end_offset)`` and how many bytes of
    ``buf`` they used; an incomplete record at the end is left for the next read. Each meta
    gets ``j``, the record's start offset in the journal (added on reading, not stored): the
    console's handle for asking for what came before a line, or since a file appeared.
    """
    raw, used = split(buf, base_offset)
    return [(decode_meta(meta, start), data, end) for meta, data, start, end in raw], used


def decode_meta(meta, start):
    """A record's meta bytes as a dict, with ``j``: the record's offset ``start``."""
    meta = _decode_meta(meta.decode("utf-8"))
    meta["j"] = start
    return meta


def kind_named(meta):
    """The kind a meta's first bytes name (``{"k":"data",...``: JournalWriter writes every
    meta so) as bytes; None for a meta that does not begin so, or names it with an escape."""
    if not meta.startswith(_KIND_AT):
        return None
    quote = meta.find(b'"', 6)
    kind = meta[6:quote] if quote > 0 else b"\\"
    return None if b"\\" in kind else kind


class JournalReader:
    """Reads whole records from an offset on, as the journal grows."""

    def __init__(self, path, offset=0):
        self.path = path
        self.offset = offset
        self._fh = None
        self._pending = b""
        self._damage = None  # the JournalCorrupt this reader stopped at, raised again

    def read(self, limit=READ_CHUNK, raw=False):
        """Records appended since the last call (at most about ``limit`` bytes of them, or
        the next record whole), as :func:`parse` gives them, or with ``raw`` as :func:`split`
        does. JournalCorrupt (agent/wire/protocol.py) once the next bytes are no record: the whole
        records before them come first, and the reader stays at the damage."""
        buf, start, used = self._whole(limit)
        if not used:
            return []
        records, _used = (split if raw else parse)(
            buf if self._damage is None else buf[:used], start)
        self._keep(buf, start, used)
        return records

    def read_metas(self, kinds, limit=READ_CHUNK):
        """The metas (``j`` added) of the records of ``kinds`` appended since the last call,
        in order, from about ``limit`` bytes of records (or the next record whole). Only the
        records' headers and metas are read, a window at each header: not their data, and a
        meta that names another kind first (:func:`kind_named`) is not decoded. A follower of
        steps and events (agent/supervisor/judge_link.py) so reads a torrent of log data for little more
        than a read a record (docs/BENCHMARKS.md, "Ingest"). Damage as for
        :meth:`read`: the metas before it first, then JournalCorrupt at each later call."""
        if self._damage is not None:
            raise self._damage
        fd = self.fileno()
        start = pos = self.offset
        if fd is None:
            return []
        size = os.fstat(fd).st_size
        wanted = {kind.encode("ascii") for kind in kinds}
        found = []
        window, at = b"", start  # the file's bytes from offset ``at``
        try:
            while pos < size and (pos == start or pos - start < limit):
                if pos + MAX_HEADER > at + len(window):
                    window, at = os.pread(fd, META_WINDOW, pos), pos
                head = record_header(window, pos - at, at)
                if head is None:  # its header is still being written
                    break
                body, meta_len, data_len = head
                end = at + body + meta_len + data_len
                if end > size:  # the record is still being written
                    break
                if body + meta_len > len(window):  # a long meta: read it whole
                    window, at = os.pread(fd, body - (pos - at) + meta_len, pos), pos
                    body = record_header(window, 0, at)[0]
                meta = window[body:body + meta_len]
                if len(meta) != meta_len or not is_meta(meta[0], meta[-1]):
                    raise JournalCorrupt(pos, "a meta that is not a JSON object")
                kind = kind_named(meta)
                if kind is None or kind in wanted:
                    meta = decode_meta(meta, pos)
                    if meta.get("k") in kinds:
                        found.append(meta)
                pos = end
        except JournalCorrupt as exc:  # at ``pos``: raised now if nothing came before it
            self._damage_at(window, start, exc)
        if pos > start:
            self.offset, self._pending = pos, b""
            self._fh.seek(pos)
        return found

    def fileno(self):
        """The journal's file descriptor (opened at the first read); None while there is no
        journal yet."""
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")
            except FileNotFoundError:
                return None
            self._fh.seek(self.offset)
        return self._fh.fileno()

    def read_bytes(self, limit=READ_CHUNK):
        """``(start, data)``: the whole records appended since the last call, as the journal
        holds them (at most about ``limit`` bytes, or the next record whole), and the offset
        they start at; damage as for :meth:`read`."""
        buf, start, used = self._whole(limit)
        if not used:  # nothing new: a record being written stays kept until its end comes
            return start, b""
        self._keep(buf, start, used)
        return start, bytes(buf[:used]) if used < len(buf) else buf

    def _whole(self, limit):
        """``(buf, start, used)``: what is left of the last read and up to ``limit`` bytes
        more, its offset, and how many of its bytes are whole records; read on while none is
        and the journal has more. Its next record may be longer than ``limit``: a 64 KiB data
        record with its header is, and a turn of serve's that stopped at it sent nothing
        until the next append (docs/BENCHMARKS.md, "Ingest")."""
        buf, start = self._chunk(limit)
        while buf:
            try:
                used = whole(buf, start)
            except JournalCorrupt as exc:
                used = self._damage_at(buf, start, exc)
            if used:
                return buf, start, used
            self._pending = buf  # kept whatever comes: the record's start
            more, _start = self._chunk(limit)
            if not more:  # the record is still being written
                break
            buf = more
        return buf, start, 0

    def _damage_at(self, buf, start, exc):
        """Where in ``buf`` the damage ``exc`` begins (the records before it are whole); each
        later read raises it (a fresh reader is the way to look again), this one too when
        ``buf`` begins with it."""
        self._damage = exc
        if exc.offset <= start:
            raise exc
        return exc.offset - start

    def _chunk(self, limit):
        """What is left of the last read and up to ``limit`` bytes more; its offset."""
        if self._damage is not None:
            raise self._damage
        if self.fileno() is None:
            return b"", self.offset
        chunk = self._fh.read(limit)
        if not chunk:
            return b"", self.offset
        return (self._pending + chunk if self._pending else chunk), self.offset

    def _keep(self, buf, start, used):
        self._pending = buf[used:]
        self.offset = start + used

    def close(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_index(path, before):
    """The index marks (record start offsets) below ``before``, ascending; 0 is implied."""
    try:
        with open(path + ".idx", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    marks = []
    for line in raw.split(b"\n"):
        if line.isdigit():
            mark = int(line)
            if mark >= before:
                break
            marks.append(mark)
    return marks


def read_back(path, before, fids, want=256 * 1024, since=0, scan=BACK_SCAN):
    """The newest ``data`` records of files ``fids`` that start before offset ``before``.

    Reads index windows backwards from ``before`` until about ``want`` bytes of their data are
    found, ``scan`` bytes were looked through, or offset ``since`` (where the oldest of the
    files was announced; nothing of theirs is older). Returns ``(records, start)``: ``(meta,
    data, end_offset)`` in journal order, as :func:`parse` gives them, and the offset the
    reading went back to (0: nothing older is left; else the next call's ``before``).
    """
    fids = set(fids)
    starts = [0] + read_index(path, before)
    pages = []
    got = scanned = 0
    end = before
    while end > 0 and starts and got < want and scanned < scan:
        start = starts.pop()
        page = []
        for rec in _records_between(path, start, end):
            meta, data = rec[0], rec[1]
            if meta.get("k") == "data" and data and meta.get("f") in fids:
                page.append(rec)
                got += len(data)
        pages.append(page)
        scanned += end - start
        end = 0 if start <= since else start
    records = [rec for page in reversed(pages) for rec in page]
    drop = 0  # a window may hold more than ``want``: the newest ``want`` bytes are the page
    while drop < len(records) and got - len(records[drop][1]) >= want:
        got -= len(records[drop][1])
        drop += 1
    if drop:
        records = records[drop:]
        end = records[0][0]["j"]
    return records, end


def _records_between(path, start, end):
    """The records that start in ``[start, end)`` (``start`` is a record's), as parse gives them."""
    with open(path, "rb") as f:
        f.seek(start)
        buf = f.read(max(0, end - start))
        records, used = parse(buf, start)
        if start + used < end:  # the last record that starts before ``end`` runs past it
            rest = buf[used:]
            while True:
                more = f.read(READ_CHUNK)
                rest += more
                last, _n = parse(rest, start + used)
                if last or not more:
                    break
            records.extend(last[:1])
    return records
