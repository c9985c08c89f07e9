"""A journal that cannot be read ends its stream visibly (agent/serve/streams.py
``stream_end``, console/run/link.py): a real ``serve`` follows journals the test writes, one of
them is damaged mid-run (garbage bytes appended, then records again). The console gets the
node's event (in the view's events and in the no-TUI output) with where and why; that node's
state, and the other subscriptions on the same agent, go on."""

from __future__ import annotations

import asyncio
import io
import json
import os
import time

from agent.wire import protocol
from agent.host.journal import JournalWriter
from console.run import messages as agent_messages
from console.verbs.headless import HeadlessPrinter
from console.run.link import NodeLink
from console.model.state import RunState
from console.transport.local import LocalTransport
from inventory.model import Host
from tests.waits import wait_for

WAIT = 30.0  # generous: only a broken stream waits this long
GARBAGE = b"\x00\xffnot a record\x1b[31m 12 x\n" * 4


def journal(run_root, node: str) -> JournalWriter:
    os.makedirs(os.path.join(run_root, node), exist_ok=True)
    return JournalWriter(os.path.join(run_root, node, "journal"))


def lines(writer: JournalWriter, *texts: str) -> None:
    """Rank 0's file announced once, then one data record of ``texts``."""
    if writer.size == 0:
        writer.append({"k": "file", "f": 1, "rank": 0, "local_rank": 0, "stream": "stdout",
                       "path": "/x/0", "world_size": 1})
    writer.append({"k": "data", "f": 1, "o": writer.size, "ts": time.time()},
                  "".join(t + "\n" for t in texts).encode())


def damage(writer: JournalWriter) -> int:
    """Garbage appended where the next record would start; that offset."""
    at = writer.size
    with open(writer.path, "ab") as f:
        f.write(GARBAGE)
    writer.size += len(GARBAGE)
    return at


def test_a_damaged_journal_ends_its_stream_with_an_event_and_the_rest_goes_on(tmp_path):
    run_root = str(tmp_path / "run")
    node0, judge = journal(run_root, "node0"), journal(run_root, "judge")

    async def main():
        state = RunState("r1", [("node0", "127.0.0.2")])
        out = io.StringIO()
        HeadlessPrinter(state, out=out, colour=False)
        link = NodeLink(Host("node0", "127.0.0.2"), LocalTransport(), state, run_root,
                        gpu=False)
        await link.connect()
        try:
            await link.subscribe()
            await link.subscribe_judge()
            lines(node0, "step=1 before the damage")
            await wait_for(lambda: "step=1 before" in out.getvalue(), WAIT, "the first line")
            at = damage(node0)
            lines(node0, "step=2 after the damage")
            await wait_for(lambda: state.nodes["node0"].stream_end is not None, WAIT,
                           lambda: "the stream's end; output %r" % out.getvalue())
            ns = state.nodes["node0"]
            assert ns.stream_end == at == ns.journal_offset
            ev = [e for e in state.events if e.kind == "stream stopped"]
            assert len(ev) == 1 and ev[0].node == "node0"
            assert "journal corrupt at offset %d" % at in ev[0].text
            assert "%s/node0/" % run_root in ev[0].text and "\x1b" not in ev[0].text
            printed = out.getvalue()
            assert "[rankdeck] node0: its log stream stopped at journal offset %d" % at \
                in printed
            # the same agent goes on: the judge's journal, and node0's own state
            judge.append({"k": "event", "what": "judge", "ts": time.time(),
                          "text": "judge event after the damage"})
            with open(os.path.join(run_root, "node0", "state.json"), "w") as f:
                json.dump({"state": "exited", "exit_code": 0}, f)
            await wait_for(lambda: ns.state == "exited", WAIT, "node0's state after the end")
            await wait_for(lambda: state.judge_offset == judge.size, WAIT,
                           "the judge's record after the damage")
            assert "step=2" not in out.getvalue()  # nothing past the damage, no traceback
            assert ns.state != "unreachable" and link.connected.is_set()
        finally:
            await link.close()
    asyncio.run(main())


async def request(stream, req_id: int, op: str, **args) -> None:
    stream.write(protocol.encode({"t": "req", "id": req_id, "op": op, "args": args}))
    await stream.drain()


async def next_message(stream) -> dict:
    """The agent's next message, checked as the console checks it."""
    msg = agent_messages.parse(await asyncio.wait_for(stream.readline(), WAIT))
    if msg["t"] == "jbytes":
        msg = agent_messages.journal_of_bytes(msg, await stream.readexactly(msg["n"]))
    return msg


def texts(seen: list[dict], sub: str) -> str:
    return "".join(r[1] for m in seen if m["t"] == "journal" and m["sub"] == sub
                   for r in m["recs"] if len(r) > 1)


async def read_until(stream, seen: list[dict], condition) -> None:
    """Read the agent's messages into ``seen`` until ``condition()`` holds (WAIT at most:
    telemetry comes every second, so a message alone is no sign of progress)."""
    async def read():
        while not condition():
            seen.append(await next_message(stream))
    try:
        await asyncio.wait_for(read(), WAIT)
    except asyncio.TimeoutError:
        raise AssertionError("not within %s s; seen %r" % (WAIT, [
            m for m in seen if m["t"] != "gpu"])) from None


def test_one_damaged_subscription_ends_alone_and_again_at_the_same_place(tmp_path):
    """On one agent: node0's journal damaged, node1's goes on; subscribing to node0 again
    (a reconnect would) meets the damage at the same offset and says so again."""
    run_root = str(tmp_path / "run")
    node0, node1 = journal(run_root, "node0"), journal(run_root, "node1")
    lines(node0, "n0 first")
    at = damage(node0)
    lines(node0, "n0 after")

    async def main():
        stream = await LocalTransport().open(Host("node0", "127.0.0.2"))
        try:
            assert (await next_message(stream))["t"] == "hello"
            for i, node in enumerate(("node0", "node1")):
                await request(stream, i + 1, "subscribe", run_root=run_root, node=node,
                              sub=node, frames=True)
            seen: list[dict] = []
            lines(node1, "n1 first")
            await read_until(stream, seen, lambda: "n1 first" in texts(seen, "node1") and
                             any(m["t"] == "stream_end" for m in seen))
            lines(node1, "n1 after node0's end")
            await read_until(stream, seen, lambda: "n1 after" in texts(seen, "node1"))
            ends = [m for m in seen if m["t"] == "stream_end"]
            assert "n0 first" in texts(seen, "node0") and "n0 after" not in texts(seen, "node0")
            assert [(m["sub"], m["offset"]) for m in ends] == [("node0", at)]
            assert "journal corrupt at offset %d" % at in ends[0]["why"]
            await request(stream, 9, "subscribe", run_root=run_root, node="node0",
                          sub="node0", offset=at, frames=True)
            again = len(seen)
            await read_until(stream, seen, lambda: any(m["t"] == "stream_end"
                                                       for m in seen[again:]))
            assert not any(m["t"] == "journal" and m["sub"] == "node0" for m in seen[again:])
            assert [(m["sub"], m["offset"]) for m in seen[again:]
                    if m["t"] == "stream_end"] == [("node0", at)]
        finally:
            await stream.close()
    asyncio.run(main())


class Out:
    """serve's output, as the messages a console reads."""

    def __init__(self):
        self.msgs: list[dict] = []
        self.head = None

    def write(self, data: bytes) -> None:
        head, _, rest = data.partition(b"\n")
        msg = agent_messages.parse(head + b"\n")
        if msg["t"] == "jbytes":
            msg = agent_messages.journal_of_bytes(msg, rest)
        self.msgs.append(msg)

    def flush(self) -> None:
        pass

    def of(self, kind: str, sub: str) -> list[dict]:
        return [m for m in self.msgs if m["t"] == kind and m.get("sub") == sub]


def server_of(tmp_path, *nodes: str):
    from agent.serve import server as serve
    run_root = str(tmp_path / "run")
    writers = [journal(run_root, n) for n in nodes]
    out = Out()
    server = serve.Server(out=out)
    server.streams.gpu_interval = 0
    for n in nodes:
        server.op_subscribe({"run_root": run_root, "node": n, "frames": True})
    return server, out, writers


def test_a_reader_gone_wrong_is_replaced_and_its_stream_goes_on(tmp_path):
    """A reader whose kept bytes went wrong (the last session's bug: it began inside a record)
    reads again, fresh, from the last record sent; no end, no line lost or twice."""
    server, out, (w,) = server_of(tmp_path, "node0")
    lines(w, "one")
    server.streams.pump(server.streams.subscriptions())
    sub = server.streams.subscriptions()[0]
    sub.reader._pending = b'ta":1,"o":9}garbage'  # a half record kept by mistake
    lines(w, "two")
    # replaced: at once
    assert server.streams.pump(server.streams.subscriptions()) == 0 and server.streams.behind
    server.streams.pump(server.streams.subscriptions())
    assert not out.of("stream_end", "node0") and sub.ended is None
    assert texts(out.msgs, "node0") == "one\ntwo\n"


def test_a_turn_failing_outside_its_journal_ends_that_subscription_alone(tmp_path,
                                                                         monkeypatch):
    from agent.serve import streams as serve_streams
    server, out, (w0, w1) = server_of(tmp_path, "node0", "node1")
    real = serve_streams.node.node_state

    def node_state(ndir, seen=None):
        if ndir.endswith("node0"):
            raise PermissionError(13, "Permission denied", ndir + "/state.json")
        return real(ndir, seen)
    monkeypatch.setattr(serve_streams.node, "node_state", node_state)
    lines(w1, "n1 line")
    server.streams.pump(server.streams.subscriptions())
    [end] = out.of("stream_end", "node0")
    assert end["why"].startswith("agent error: PermissionError") and end["offset"] == 0
    assert [s.sub_id for s in server.streams.subscriptions()] == ["node1"]
    assert texts(out.msgs, "node1") == "n1 line\n"
