"""The wire format between the console and an agent (`serve`), and the journal record format.

One JSON object per line, ASCII only (``ensure_ascii``), so that log bytes that are not valid
UTF-8 survive the trip: they are decoded with ``surrogateescape`` on the node, travel as
``\\udcXX`` escapes, and :func:`text_to_bytes` turns them back into the exact bytes.

Message kinds (field ``t``); docs/PROTOCOL.md is the reference:

- ``hello``   agent -> console, first line: protocol version, agent version, host facts.
- ``req``     console -> agent: ``{"t": "req", "id": N, "op": NAME, "args": {...}}``.
- ``res``     agent -> console: ``{"t": "res", "id": N, "ok": true, "data": {...}}`` or
              ``{"t": "res", "id": N, "ok": false, "error": MESSAGE, "kind": KIND}``.
- ``journal`` agent -> console: records of one node's run journal, with the byte offset just
              past the last one (``end``), to resume from after a reconnect.
- ``jbytes``  agent -> console, to a console that subscribed with ``frames``: the same
              records as the journal holds them, ``n`` raw bytes after the message's line.
- ``state``   agent -> console: one node's supervisor state (state.json) when it changes.
- ``gpu``     agent -> console: one GPU snapshot of the host.
- ``actions`` agent -> console: new lines of one node's action log (who changed the run).
- ``consoles`` agent -> console: the consoles attached to one node, when that changes.
- ``stream_end`` agent -> console: one subscription's journal can no longer be read (why, and
              the offset it stopped at); its state, actions and consoles messages go on.

This module is imported by the console; it must stay standard-library only and run on 3.8.
"""

import json

PROTOCOL_VERSION = 1

MAX_HEADER = 64  # bytes of a journal record's header (``<meta_len> <data_len>\n``) at most
# bytes of one journal record at most: a console takes no bigger jbytes message (16 MiB), and
# a header asking for more is damage, not a record to wait for
MAX_RECORD = 16 * 1024 * 1024

# Batching of pushed messages: at most this long, or this many bytes, whichever comes first.
BATCH_SECONDS = 0.05
BATCH_BYTES = 64 * 1024

# Requests (``op``) a serve process understands.
OPS = (
    "ping",
    "hello",  # who the console is; role "watch" makes the connection read-only
    "actions",  # a node's action log
    "preflight",
    "store_start",
    "store_wait",  # the store an early store_start began, once it serves
    "store_stop",
    "expel",  # a fenced node's dead torchrun taken out of the rendezvous (agent/surgery/expel.py)
    "start",
    "subscribe",
    "unsubscribe",
    "stop",
    "restart",
    "fence",  # cordon: no start or restart of the node from now on, then stop it
    "unfence",
    "drop_workers",  # cordon of a hung node: the other nodes' stalled workers killed
    "host_up",  # a Slurm job's rankdeck-host step answers here (agent/slurm/host_step.py)
    "standby",  # launch --auto-cordon: a spare's start spec, kept for the run's judge
    "runs",
    "state",
    "scrollback",
    "stacks",
    "probe_tcp",
    "listen",
    "unlisten",
    # code to the hosts (agent/sync/place.py)
    "sync_check",
    "sync_plan",
    "sync_put",
    "sync_commit",
    "sync_abort",
)


class RequestError(Exception):
    """A request the agent cannot do; ``kind`` (sent as the answer's ``kind``) says what sort.

    Usually means the console asked for something this host's state does not allow (a node
    already running, a run folder that is not there) or a wait ran out.
    """

    def __init__(self, message, kind="error"):
        super().__init__(message)
        self.kind = kind


class ProtocolError(Exception):
    """A line that is not a protocol message; usually means the other side is not an agent."""


class JournalCorrupt(ValueError):
    """Bytes at ``offset`` of a journal that are no record: usually means the journal file was
    damaged (a disk error, another writer, a copy cut short); the records before it are whole."""

    def __init__(self, offset, what):
        super().__init__("journal corrupt at offset %d: %s" % (offset, what))
        self.offset = offset


def run_id_ok(run_id):
    """Whether ``run_id`` is a run id both sides accept: 1 to 128 ASCII letters, digits, '.',
    '_' and '-', not '.' or '..' (it names a folder on the hosts and a file on the laptop)."""
    return isinstance(run_id, str) and 0 < len(run_id) <= 128 and \
        run_id not in (".", "..") and all(c.isascii() and (c.isalnum() or c in "._-")
                                          for c in run_id)


def encode(msg):
    """One message as one ASCII line (bytes, newline included)."""
    return (json.dumps(msg, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def decode(line):
    """Parse one line; raises ProtocolError with the start of the line when it is not a message."""
    try:
        msg = json.loads(line)
    except RecursionError:  # JSON nested deeper than the interpreter's stack
        raise ProtocolError("a message nested too deeply") from None
    except ValueError:
        shown = line[:200].decode("utf-8", "replace") if isinstance(line, bytes) else line[:200]
        raise ProtocolError("not a protocol message: %r" % shown) from None
    if not isinstance(msg, dict) or "t" not in msg:
        raise ProtocolError("not a protocol message: %r" % (msg,))
    return msg


_encode_compact = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode
_encode_text = json.encoder.encode_basestring_ascii  # what json.dumps does with a str


def journal_line(sub, end, records):
    """The ``journal`` message of ``records`` as :func:`split_records` gives them: the bytes
    :func:`encode` makes of ``{"t": "journal", "sub", "end", "recs"}`` with the records parsed,
    built without parsing them. Each meta, an ASCII JSON object as the supervisor wrote it, is
    passed on with ``j`` (its offset) put at its end: decoding and encoding every meta again
    was most of ``serve``'s work a line. Raises ValueError for a meta that is not one line of
    ASCII JSON object (a journal only the supervisor writes has none)."""
    parts = []
    for meta, data, start, _end in records:
        if not (meta[:1] == b"{" and meta[-1:] == b"}" and meta.isascii()) or b"\n" in meta:
            raise ValueError("journal record at offset %d is not a JSON object" % start)
        j = (b',"j":%d}' if len(meta) > 2 else b'"j":%d}') % start
        if data:
            text = _encode_text(bytes_to_text(data)).encode("ascii")
            parts.append(b"[%s%s,%s]" % (meta[:-1], j, text))
        else:
            parts.append(b"[%s%s]" % (meta[:-1], j))
    return b'{"t":"journal","sub":%s,"end":%d,"recs":[%s]}\n' % (
        _encode_compact(sub).encode("ascii"), end, b",".join(parts))


def journal_bytes(sub, start, data):
    """The ``jbytes`` message of ``data``, whole journal records from offset ``start`` as the
    journal holds them: a line saying what follows, then the bytes. Escaping every byte of
    log data into a JSON string here and decoding it again on the console was most of the
    CPU both spent a line (docs/BENCHMARKS.md, "Ingest")."""
    return b'{"t":"jbytes","sub":%s,"start":%d,"end":%d,"n":%d}\n%s' % (
        _encode_compact(sub).encode("ascii"), start, start + len(data), len(data), data)


def split_records(buf, base_offset=0):
    """Whole journal records (agent/host/journal.py) at the start of ``buf``, metas not decoded:
    ``([(meta_bytes, data, start_offset, end_offset), ...], consumed)``; ``base_offset`` is
    where ``buf`` starts in the journal. An incomplete record at the end is left for the next
    read; ValueError for bytes that are no journal. ``serve`` passes the metas on as they are,
    and a console reads the records of a ``jbytes`` message with it."""
    records = []
    for pos, body, meta_len, end in _walk(buf, base_offset):
        records.append((bytes(buf[body:body + meta_len]), bytes(buf[body + meta_len:end]),
                        base_offset + pos, base_offset + end))
    return records, records[-1][3] - base_offset if records else 0


def whole_records(buf, base_offset=0):
    """How many bytes at the start of ``buf`` are whole records (none copied: ``serve``
    sends them to a console as they are: :func:`journal_bytes`)."""
    end = 0
    for _pos, _body, _meta_len, end in _walk(buf, base_offset):
        pass
    return end


def _walk(buf, base_offset):
    """``(start, body, meta_len, end)`` in ``buf`` of each whole record: where its header
    starts, where its meta starts and how long it is, where the record ends; JournalCorrupt
    (a ValueError) for bytes that are no record, after the whole records before them."""
    pos = 0
    size = len(buf)
    while pos < size:
        head = record_header(buf, pos, base_offset)
        if head is None:
            return
        body, meta_len, data_len = head
        end = body + meta_len + data_len
        if end > size:
            return
        if not is_meta(buf[body], buf[body + meta_len - 1]):
            raise JournalCorrupt(base_offset + pos, "a meta that is not a JSON object")
        yield pos, body, meta_len, end
        pos = end


def record_header(buf, pos, base_offset=0):
    """``(body, meta_len, data_len)`` of the record whose header starts at ``pos`` in ``buf``
    (``body``: where its meta starts); None while the header is not whole in ``buf``;
    JournalCorrupt for bytes that are no header (``base_offset``: where ``buf`` starts)."""
    nl = buf.find(b"\n", pos, pos + MAX_HEADER)
    if nl < 0:
        if len(buf) - pos >= MAX_HEADER:
            raise JournalCorrupt(base_offset + pos, "no header in %d bytes" % MAX_HEADER)
        return None
    try:
        meta_len, data_len = (int(x) for x in buf[pos:nl].split())
    except ValueError:
        raise JournalCorrupt(base_offset + pos, "a header that is not "
                             "'<meta_len> <data_len>'") from None
    # a console reads records a host sent: no loop back, no wait for a length of damage
    if not (2 <= meta_len and 0 <= data_len and meta_len + data_len <= MAX_RECORD):
        raise JournalCorrupt(base_offset + pos, "a record of %d + %d bytes"
                             % (meta_len, data_len))
    return nl + 1, meta_len, data_len


def is_meta(first, last):
    """Whether a meta's first and last bytes are those of a JSON object's: ``{`` ... ``}``."""
    return first == 0x7B and last == 0x7D


def bytes_to_text(data):
    """Log bytes as a str that round-trips exactly through JSON (see module docstring)."""
    return data.decode("utf-8", "surrogateescape")


def text_to_bytes(text):
    """The exact bytes behind a str made by :func:`bytes_to_text`."""
    return text.encode("utf-8", "surrogateescape")


def hello(agent_version, host, python_version, pid):
    return {
        "t": "hello",
        "proto": PROTOCOL_VERSION,
        "agent": agent_version,
        "host": host,
        "python": python_version,
        "pid": pid,
    }
