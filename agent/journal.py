"""A node's run journal: one append-only file the supervisor writes and every `serve` reads.

Why a journal and not torchrun's log files directly: torchrun deletes an ``attempt_<n>``
folder when a membership change restarts its workers (see FACTS.md), and global ranks move
between nodes across restarts. The supervisor follows the live files (keeping them open, so
even a deleted file is read to its end), tags every chunk with the file it came from, and
appends it here with the metrics parsed from it and the run's events. A console then needs one
number per node - the journal offset it has seen - to resume after a reconnect and receive
every line exactly once.

Record layout: an ASCII header ``<meta_len> <data_len>\\n``, then ``meta_len`` bytes of JSON
(an object with ``k``, the record kind), then ``data_len`` raw bytes (log data; empty for
other kinds). Kinds: ``file`` (a followed file and its rank), ``data`` (bytes of a file from
source offset ``o``), ``metric``, ``ckpt``, ``event``.
"""

import json
import os

MAX_HEADER = 64
READ_CHUNK = 1 << 20


class JournalWriter:
    """Appends records; one writer per journal (the node's supervisor)."""

    def __init__(self, path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def append(self, meta, data=b""):
        body = json.dumps(meta, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        header = b"%d %d\n" % (len(body), len(data))
        # One write per record so a reader never sees a header without its body for long.
        os.write(self._fd, header + body + data)

    def append_many(self, records):
        parts = []
        for meta, data in records:
            body = json.dumps(meta, ensure_ascii=True, separators=(",", ":")).encode("ascii")
            parts.append(b"%d %d\n" % (len(body), len(data)))
            parts.append(body)
            parts.append(data)
        if parts:
            os.write(self._fd, b"".join(parts))

    def close(self):
        os.close(self._fd)


def parse(buf, base_offset=0):
    """Split a buffer into whole records.

    Returns ``(records, consumed)``: a list of ``(meta, data, end_offset)`` and how many bytes of
    ``buf`` they used; an incomplete record at the end is left for the next read.
    """
    records = []
    pos = 0
    size = len(buf)
    while pos < size:
        nl = buf.find(b"\n", pos, pos + MAX_HEADER)
        if nl < 0:
            if size - pos >= MAX_HEADER:
                raise ValueError("journal corrupt at offset %d" % (base_offset + pos))
            break
        meta_len, data_len = (int(x) for x in buf[pos:nl].split())
        end = nl + 1 + meta_len + data_len
        if end > size:
            break
        meta = json.loads(buf[nl + 1 : nl + 1 + meta_len])
        data = bytes(buf[nl + 1 + meta_len : end])
        records.append((meta, data, base_offset + end))
        pos = end
    return records, pos


class JournalReader:
    """Reads whole records from an offset on, as the journal grows."""

    def __init__(self, path, offset=0):
        self.path = path
        self.offset = offset
        self._fh = None
        self._pending = b""

    def read(self, limit=READ_CHUNK):
        """Records appended since the last call (at most about ``limit`` bytes of them)."""
        if self._fh is None:
            try:
                self._fh = open(self.path, "rb")
            except FileNotFoundError:
                return []
            self._fh.seek(self.offset)
        chunk = self._fh.read(limit)
        if not chunk:
            return []
        buf = self._pending + chunk if self._pending else chunk
        start = self.offset
        records, used = parse(buf, start)
        self._pending = buf[used:]
        self.offset = start + used
        return records

    def close(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None
