"""Journal records sent as the journal holds them (``jbytes``: agent/wire/protocol.py
journal_bytes, console/run/messages.py journal_of_bytes) reach the console as the same
records a ``journal`` message brings; bytes that are no whole records are refused."""

from __future__ import annotations

import pytest

from agent.wire import protocol
from agent.serve import server as serve
from agent.host.journal import JournalReader, JournalWriter
from console.run import messages as agent_messages

RECORDS = [
    ({"k": "file", "f": 1, "rank": 0, "local_rank": 0, "stream": "stdout", "path": "/x/0"}, b""),
    ({"k": "data", "f": 1, "o": 0, "ts": 1.5}, b"step=1 loss=2.0\nbad utf-8 \xff\xfe\rbar\r"),
    ({"k": "metric", "f": 1, "step": 1, "loss": 2.0, "ts": 1.5}, b""),
    ({"k": "data", "f": 1, "o": 40, "ts": 1.6}, b'"quoted" \\ \t\x1b[31mred\n'),
    ({"k": "event", "what": "launched", "ts": 2.0, "node": "n1"}, b""),
]


def frame_of(message: bytes):
    """A jbytes message as a console reads it: its line, then exactly n bytes."""
    head, rest = message.split(b"\n", 1)
    msg = agent_messages.parse(head + b"\n")
    assert msg["t"] == "jbytes" and len(rest) == msg["n"]
    return agent_messages.journal_of_bytes(msg, rest)


def test_a_jbytes_message_brings_what_a_journal_message_does(tmp_path):
    path = str(tmp_path / "journal")
    writer = JournalWriter(path)
    writer.append_many(RECORDS)
    writer.close()
    start, data = JournalReader(path).read_bytes()
    framed = frame_of(protocol.journal_bytes("n1", start, data))
    records = JournalReader(path).read(raw=True)
    as_json = agent_messages.parse(protocol.journal_line("n1", records[-1][3], records))
    assert framed == as_json
    assert [protocol.text_to_bytes(r[1]) for r in framed["recs"] if len(r) > 1] == \
        [data for meta, data in RECORDS if data]  # every byte as written
    assert framed["end"] == len(data) == records[-1][3]


def test_a_record_still_being_written_waits_for_the_next_read(tmp_path):
    path = str(tmp_path / "journal")
    writer = JournalWriter(path)
    writer.append_many(RECORDS[:2])
    whole = writer.size
    with open(path, "ab") as f:  # the next record's header and half its meta
        f.write(b'40 3\n{"k":"data",')
    reader = JournalReader(path)
    assert reader.read_bytes() == (0, open(path, "rb").read()[:whole])
    assert reader.read_bytes() == (whole, b"")  # nothing new yet: the half record is kept
    with open(path, "ab") as f:  # its end: the record comes whole from where it starts
        f.write(b'"f":1,"o":9,"ts":2.00000000}abc')
    start, data = reader.read_bytes()
    assert (start, data[:8], len(data)) == (whole, b'40 3\n{"k', 48)
    assert protocol.split_records(data, start)[0][0][1] == b"abc"
    writer.close()


def test_a_record_longer_than_a_read_comes_whole_from_that_read(tmp_path, monkeypatch):
    """A 64 KiB data record with its header is longer than serve's 64 KiB read: the read goes
    on to the record's end (it returned nothing, and serve's turn sent nothing, until the
    supervisor's next append)."""
    path = str(tmp_path / "n1" / "journal")
    (tmp_path / "n1").mkdir()
    writer = JournalWriter(path)
    line = b"rank=3 seq=1234567 t=1795723407.123456 " + b"x" * 40 + b"\n"
    big = ({"k": "data", "f": 1, "o": 0, "ts": 1.5}, line * (65536 // len(line)))
    writer.append_many([RECORDS[0]])
    at = writer.size  # where the long records start: nothing of them read before
    writer.append_many([big] * 3)
    start, data = JournalReader(path, at).read_bytes(protocol.BATCH_BYTES)
    assert (start, len(data)) == (at, (writer.size - at) // 3)
    records = JournalReader(path, at).read(protocol.BATCH_BYTES, raw=True)
    assert [r[2] for r in records] == [at]
    monkeypatch.setattr(serve.node, "node_dir", lambda args: str(tmp_path / "n1"))
    out = Out()
    server = serve.Server(out=out)
    server.streams.gpu_interval = 0
    server.op_subscribe({"node": "n1", "frames": True, "offset": at})
    # one turn: every record, as the journal holds them
    server.streams.pump(server.streams.subscriptions())
    assert server.streams.subscriptions()[0].reader.offset == writer.size
    writer.close()


@pytest.mark.parametrize("data,reason", [
    (b"-20 0\n" + b"x" * 30, "journal corrupt"),  # a length that would read backwards
    (b'12 0\n{"k":"data"', "cut short"),
    (b"4 0\n[1,2]", "no whole journal records"),
    (b"4 0\nnope", "no whole journal records"),
    (b"x" * 100, "journal corrupt"),
    (b'12 0\n{"k":"file"}', "has f no value"),  # a whole record, checked as any other
])
def test_bytes_that_are_no_whole_records_are_refused_with_the_reason(data, reason):
    msg = {"t": "jbytes", "sub": "n1", "start": 0, "end": len(data), "n": len(data)}
    with pytest.raises(protocol.ProtocolError, match=reason):
        agent_messages.journal_of_bytes(msg, data)


@pytest.mark.parametrize("head,reason", [
    (b'{"t":"jbytes","sub":"n1","start":0,"end":5,"n":4}', "not start \\+ n"),
    (b'{"t":"jbytes","sub":"n1","start":0,"end":99999999999,"n":99999999999}', "n = "),
    (b'{"t":"jbytes","sub":"n1","start":-1,"end":3,"n":4}', "start = -1"),
])
def test_a_jbytes_line_is_checked_before_its_bytes_are_read(head, reason):
    with pytest.raises(protocol.ProtocolError, match=reason):
        agent_messages.parse(head + b"\n")


class Out:
    def __init__(self):
        self.buf = b""

    def write(self, data):
        self.buf += data

    def flush(self):
        pass


def test_serve_frames_records_for_a_console_that_asks_past_quiet_until(tmp_path, monkeypatch):
    ndir = tmp_path / "n1"
    ndir.mkdir()
    writer = JournalWriter(str(ndir / "journal"))
    writer.append_many(RECORDS[:2])
    quiet_until = writer.size  # a resuming console: the lines before this are left out
    writer.append_many(RECORDS[2:])
    monkeypatch.setattr(serve.node, "node_dir", lambda args: str(ndir))
    out = Out()
    server = serve.Server(out=out)
    server.streams.gpu_interval = 0
    server.op_subscribe({"node": "n1", "frames": True, "quiet_until": quiet_until})
    server.streams.pump(server.streams.subscriptions())
    first = out.buf.split(b"\n", 1)[0] + b"\n"
    skipped = agent_messages.parse(first)  # from before quiet_until: filtered, as JSON
    assert [r[0]["k"] for r in skipped["recs"]] == ["file", "metric", "data", "event"]
    out.buf = b""
    writer.append_many(RECORDS[1:2])  # past quiet_until: as the journal holds it
    writer.close()
    server.streams.pump(server.streams.subscriptions())
    framed = frame_of(out.buf)
    assert [r[0]["k"] for r in framed["recs"]] == ["data"]
    assert framed["recs"][0][0]["j"] == skipped["end"]

    out.buf = b""  # a console that does not ask gets journal messages, as before
    server.op_subscribe({"node": "n1", "sub": "other"})
    server.streams.pump(server.streams.subscriptions()[-1:])
    assert b'"t":"jbytes"' not in out.buf and out.buf.count(b'"t":"journal"') == 1


def test_serve_turns_again_at_once_only_while_a_journal_is_left_unread(tmp_path, monkeypatch):
    """A flood read to its end waits for the next append (a second turn at once found
    nothing: half of serve's turns at 100k lines/s); more than a turn's budget, not."""
    ndir = tmp_path / "n1"
    ndir.mkdir()
    writer = JournalWriter(str(ndir / "journal"))
    data = {"k": "data", "f": 1, "o": 0, "ts": 1.0}
    writer.append_many([RECORDS[0]] + [(data, b"x" * 1000 + b"\n")] * 50)  # a turn's flood
    monkeypatch.setattr(serve.node, "node_dir", lambda args: str(ndir))
    server = serve.Server(out=Out())
    streams = server.streams
    streams.gpu_interval = 0
    server.op_subscribe({"node": "n1", "frames": True})
    assert streams.pump(streams.subscriptions()) > 50_000 and not streams.behind
    budget = protocol.BATCH_BYTES * 4  # what one turn sends of a journal at most
    writer.append_many([(data, b"y" * 60_000 + b"\n")] * (budget // 60_000 + 2))
    writer.close()
    assert streams.pump(streams.subscriptions()) >= budget and streams.behind
    streams.pump(streams.subscriptions())
    assert not streams.behind and streams.subscriptions()[0].reader.offset == writer.size
