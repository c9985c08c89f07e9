"""What a serve turn has ready of a journal goes to a console as one ``jbytes`` message, up to
the turn's bound (agent/serve/streams.py ``TURN_BYTES``), and serve's output pipe is widened:
under a torrent the console woke for every 64 KiB (docs/BENCHMARKS.md, "Ingest")."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys

import pytest

from agent.serve import server as serve, streams as serve_streams
from agent.host.journal import JournalWriter
from console.run import messages as agent_messages
from tests.agent.test_journal_bytes import Out

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F_GETPIPE_SZ = 1032
FILE = ({"k": "file", "f": 1, "rank": 0, "local_rank": 0, "stream": "stdout", "path": "/x/0"},
        b"")
LINE = b"rank=0 seq=1234567 t=1795723407.123456 " + b"x" * 40 + b"\n"


def messages(buf: bytes):
    """The jbytes messages in ``buf`` as a console reads them, ``(header, journal message)``
    each (serve's state, actions and consoles messages left aside)."""
    out = []
    while buf:
        head, buf = buf.split(b"\n", 1)
        msg = agent_messages.parse(head + b"\n")
        if msg["t"] != "jbytes":
            continue
        out.append((msg, agent_messages.journal_of_bytes(msg, buf[:msg["n"]])))
        buf = buf[msg["n"]:]
    return out


def served(tmp_path, monkeypatch, records, offset=0):
    """A serve subscribed with frames to a journal of ``records``; (server, out, writer)."""
    ndir = tmp_path / "n1"
    ndir.mkdir(exist_ok=True)
    writer = JournalWriter(str(ndir / "journal"))
    writer.append_many(records)
    monkeypatch.setattr(serve.node, "node_dir", lambda args: str(ndir))
    out = Out()
    server = serve.Server(out=out)
    server.streams.gpu_interval = 0
    server.op_subscribe({"node": "n1", "frames": True, "offset": offset})
    return server, out, writer


def data(o, size):
    return ({"k": "data", "f": 1, "o": o, "ts": 1.0}, LINE * (size // len(LINE)))


def test_what_a_turn_has_ready_goes_as_one_message(tmp_path, monkeypatch):
    # a supervisor's turn at a torrent: records of 40 KB, more than one 64 KiB read's worth
    records = [FILE] + [data(i * 40_000, 40_000) for i in range(4)]
    server, out, writer = served(tmp_path, monkeypatch, records)
    server.streams.pump(server.streams.subscriptions())
    (head, msg), = messages(out.buf)  # one message, not one a 64 KiB read
    assert (head["start"], head["end"]) == (0, writer.size)
    assert [r[0]["k"] for r in msg["recs"]] == ["file"] + ["data"] * 4
    assert not server.streams.behind
    writer.close()


def test_a_message_holds_a_turn_s_bound_at_most_and_every_record_once(tmp_path, monkeypatch):
    """More than a turn's bound: messages of TURN_BYTES at most (or one longer record), the
    rest the next turn; each record once, in order; a console resuming from where a message
    ended (a reconnect) gets the rest once."""
    bound = serve_streams.TURN_BYTES
    records = [FILE] + [data(i, 60_000) for i in range(12)] + [data(99, bound + 5_000)]
    server, out, writer = served(tmp_path, monkeypatch, records)
    turns = 0
    while server.streams.subscriptions()[0].reader.offset < writer.size:
        server.streams.pump(server.streams.subscriptions())
        turns += 1
    got = messages(out.buf)
    assert turns >= 3 and len(got) >= 4
    ends = [0]
    for head, msg in got:
        assert head["start"] == ends[-1]  # nothing left out, nothing twice
        assert head["n"] <= bound or len(msg["recs"]) == 1  # only a longer record goes whole
        ends.append(head["end"])
    assert ends[-1] == writer.size
    assert sum(len(msg["recs"]) for _h, msg in got) == len(records)

    resumed, out2, _w = served(tmp_path, monkeypatch, [], offset=ends[2])
    while resumed.streams.subscriptions()[0].reader.offset < writer.size:
        resumed.streams.pump(resumed.streams.subscriptions())
    again = messages(out2.buf)
    assert again[0][0]["start"] == ends[2] and again[-1][0]["end"] == writer.size
    assert [r[0]["j"] for _h, m in again for r in m["recs"]] == \
        [r[0]["j"] for _h, m in got[2:] for r in m["recs"]]
    writer.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="F_SETPIPE_SZ is Linux's")
def test_serve_widens_its_output_pipe(tmp_path):
    """A real ``agent serve`` on a pipe: once it has said hello its output pipe holds
    PIPE_BYTES (where the system's limit allows it), not the kernel's 64 KiB."""
    with open("/proc/sys/fs/pipe-max-size") as f:
        if int(f.read()) < serve.PIPE_BYTES:
            pytest.skip("this system caps pipes below PIPE_BYTES")
    proc = subprocess.Popen([sys.executable, "-m", "agent", "serve"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert b'"t":"hello"' in proc.stdout.readline().replace(b" ", b"")
        assert fcntl.fcntl(proc.stdout.fileno(), F_GETPIPE_SZ) == serve.PIPE_BYTES
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()


def test_what_is_no_pipe_is_left_as_it_is(tmp_path):
    a, b = socket.socketpair()
    with a, b, open(tmp_path / "f", "wb") as f:
        serve.widen_pipe(a.fileno())  # no error: a socket (an SSH channel's may be one)
        serve.widen_pipe(f.fileno())
        a.sendall(b"still a socket")
        assert b.recv(64) == b"still a socket"
