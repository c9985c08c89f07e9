"""NodeLink: the console's connection to one node's agent, with requests and reconnects.

It speaks agent/wire/protocol.py over an AgentStream from any transport, feeds pushed journal and
state messages into RunState in arrival order, and after a dropped connection reconnects by
itself and resubscribes from the journal offset RunState has seen: every record arrives
exactly once.

Every connection begins with a ``hello`` request saying who this console is and its role
(console/model/consoles.py ``Me``): a read-only console's connection is refused every change by the
agent itself. The agents' ``actions`` and ``consoles`` messages go to ``state.operators``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from agent.wire import protocol
from . import messages as agent_messages
from ..errors import AgentError
from ..model.consoles import Me
from ..judgement.judged import apply_judge_records
from ..lines.sanitize import clean
from ..model.state import RunState
from ..transport.base import AgentStream, HostUnreachable, Transport

log = logging.getLogger("rankdeck.link")
HELLO_TIMEOUT = 60.0
BACKOFF = (0.5, 1.0, 2.0, 3.0, 5.0)


class NodeLink:
    def __init__(self, host, transport: Transport, state: RunState | None, run_root: str,
                 reconnect: bool = True, gpu: bool = True, me: Me | None = None):
        self.host = host
        self.name = host.name
        self.transport = transport
        self.state = state
        self.run_root = run_root
        self.reconnect = reconnect
        self.me = me  # who this console is, said in each connection's hello
        self.stream: AgentStream | None = None
        self.hello: dict | None = None
        self.subscribed = False
        self.judge_subscribed = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._reconnecting: asyncio.Task | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self.quiet_until = 0  # first subscription: skip log lines before this journal offset
        self.stream_ends: dict[str, int] = {}  # sub -> where its agent's stream stopped

    # -- connection ------------------------------------------------------------------------
    async def connect(self) -> dict:
        """Open the stream and read the agent's hello. Raises HostUnreachable."""
        stream = await self.transport.open(self.host)
        try:
            hello = await self._read_hello(stream)
        except BaseException:  # a bad hello, or close() cancelling a reconnect: end the agent
            await asyncio.shield(stream.close())
            raise
        self.stream = stream
        self.hello = hello
        self._reader = asyncio.ensure_future(self._read_loop(stream))
        if self.me is not None:
            await self._say_hello(stream)
        self.connected.set()
        return hello

    async def _say_hello(self, stream: AgentStream) -> None:
        """Tell the agent who this console is and its role before anything else; a console
        that must be read-only and cannot say so does not use the connection."""
        try:
            answer = await self.request("hello", timeout=HELLO_TIMEOUT, **self.me.hello())
        except AgentError as exc:
            if exc.kind == "usage" and not self.me.read_only:
                return  # an agent without `hello` (a test's stand-in): it may drive
            self.stream = None
            self._reader.cancel()
            await asyncio.shield(stream.close())
            raise HostUnreachable("agent-failed", "%s: the agent refused this console's hello: "
                                  "%s" % (self.name, exc)) from None
        self.hello["login"] = clean(str(answer.get("login", "")), limit=100)

    async def _read_hello(self, stream: AgentStream) -> dict:
        try:
            line = await asyncio.wait_for(stream.readline(), HELLO_TIMEOUT)
        except asyncio.TimeoutError:
            raise HostUnreachable("agent-failed", "%s: agent sent no hello within %d s"
                                  % (self.name, HELLO_TIMEOUT)) from None
        if not line:
            raise HostUnreachable("agent-failed", "%s: agent exited before its hello; run "
                                  "`rankdeck check` for the cause" % self.name)
        return self._check_hello(line)

    def _check_hello(self, line: bytes) -> dict:
        """The agent's hello, if it speaks this console's protocol and is the agent version
        the transport installed; else HostUnreachable("agent-failed")."""
        try:
            hello = agent_messages.parse(line)
        except protocol.ProtocolError as exc:
            raise HostUnreachable("agent-failed", "%s: protocol error: %s"
                                  % (self.name, clean(str(exc)))) from None
        if hello.get("t") != "hello" or hello.get("proto") != protocol.PROTOCOL_VERSION:
            raise HostUnreachable("agent-failed", "%s: agent speaks protocol %s, this console "
                                  "speaks %s" % (self.name, clean(repr(hello.get("proto"))[:40]),
                                                 protocol.PROTOCOL_VERSION))
        expected = self.transport.expected_agent()
        if expected is not None and hello.get("agent") != expected[0]:
            version, folder = expected
            raise HostUnreachable(
                "agent-failed", "%s: agent version mismatch: host runs %s, console has %s; the "
                "copy in %s on the host is damaged or another `agent` package shadows it: "
                "remove that folder and retry" % (self.name, clean(repr(hello.get("agent"))[:60]),
                                                  version, folder))
        return hello

    async def close(self) -> None:
        self._closing = True
        tasks = [task for task in (self._reconnecting, self._reader)
                 if task is not None and not task.done() and task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        # wait for them: a reconnect cancelled while it waits for a new agent's hello closes
        # that agent on its way out
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.stream is not None:
            await self.stream.close()
            self.stream = None
        self._fail_pending(AgentError("%s: connection closed" % self.name, "closed"))

    def _fail_pending(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()

    # -- requests --------------------------------------------------------------------------
    async def request(self, op: str, timeout: float | None = 120.0, **args) -> dict:
        if self.stream is None:
            raise AgentError("%s: not connected" % self.name, "closed")
        req_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        self.stream.write(protocol.encode({"t": "req", "id": req_id, "op": op, "args": args}))
        await self.stream.drain()
        try:
            data = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise AgentError("%s: %s got no answer within %s s" % (self.name, op, timeout),
                             "timeout") from None
        finally:
            self._pending.pop(req_id, None)
        try:
            agent_messages.check_answer(op, data)
        except protocol.ProtocolError as exc:  # a broken or hostile agent: never a traceback
            raise AgentError("%s: protocol error: %s" % (self.name, clean(str(exc), limit=300)),
                             "protocol") from None
        return data

    async def subscribe(self) -> dict:
        offset = self.state.nodes[self.name].journal_offset if self.state else 0
        if self.state and offset == 0:
            self.state.nodes[self.name].data_from = self.quiet_until
        actions_from = self.state.operators.actions_from.get(self.name, 0) if self.state else 0
        data = await self.request("subscribe", run_root=self.run_root, node=self.name,
                                  sub=self.name, offset=offset, quiet_until=self.quiet_until,
                                  actions_from=actions_from, **self._frames())
        self.subscribed = True
        return data

    async def subscribe_judge(self) -> dict:
        """Also follow the run's judge's journal (this is the rendezvous host's link)."""
        data = await self.request("subscribe", run_root=self.run_root, node="judge",
                                  sub="judge", offset=self.state.judge_offset, **self._frames())
        self.judge_subscribed = True
        return data

    def _frames(self) -> dict:
        """``frames: true`` where this stream reads raw bytes: the journal's records come as
        the journal holds them (``jbytes``), not escaped into JSON and decoded again (an
        older agent leaves the argument aside and sends ``journal`` messages)."""
        return {"frames": True} if self.stream is not None and self.stream.frames else {}

    # -- incoming --------------------------------------------------------------------------
    async def _read_loop(self, stream: AgentStream) -> None:
        why = "connection lost"
        try:
            while True:
                line = await stream.readline()
                if not line:
                    break
                msg = agent_messages.parse(line)
                if msg["t"] == "jbytes":  # its records follow as raw bytes (checked: MAX_FRAME)
                    msg = agent_messages.journal_of_bytes(msg, await stream.readexactly(msg["n"]))
                self._dispatch(msg)
        except protocol.ProtocolError as exc:
            why = "protocol error: %s" % clean(str(exc), limit=300)
        except (HostUnreachable, ConnectionError, OSError) as exc:
            log.warning("%s: stream broke: %s", self.name, exc)
            if isinstance(exc, HostUnreachable) and exc.cause == "protocol":
                why = "protocol error: %s" % clean(str(exc), limit=300)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a message the checks let through and the reducer choked on
            log.exception("%s: message not understood", self.name)
            why = "protocol error: %s" % clean("%s: %s" % (type(exc).__name__, exc), limit=300)
        if self._closing:
            return
        self.connected.clear()
        self.stream = None
        if why != "connection lost":  # the agent is still there: end it, start a fresh one
            log.warning("%s: %s", self.name, why)
            await stream.close()
        self._fail_pending(AgentError("%s: %s" % (self.name, why), "closed"))
        if self.state is not None:
            self.state.set_node(self.name, "unreachable", why + "; reconnecting")
            self.state.add_event(self.name, "unreachable", why + "; reconnecting")
        if self.reconnect:
            self._reconnecting = asyncio.ensure_future(self._reconnect_loop())

    def _dispatch(self, msg: dict) -> None:
        kind = msg.get("t")
        if kind == "res":
            fut = self._pending.get(msg.get("id"))
            if fut is not None and not fut.done():
                if msg.get("ok"):
                    fut.set_result(msg.get("data") or {})
                else:
                    # host text: shown and printed, so cleaned like a log line
                    fut.set_exception(AgentError("%s: %s" % (self.name,
                                                             clean(str(msg.get("error")))),
                                                 msg.get("kind") or "error"))
        elif kind == "journal" and self.state is not None and msg.get("sub") == "judge":
            self.state.goodput.add_all(None, msg.get("recs", []))
            apply_judge_records(self.state, msg.get("recs", []), msg.get("end", 0), self.name)
        elif kind == "journal" and self.state is not None:
            self.state.goodput.add_all(self.name, msg.get("recs", []))
            self.state.apply_records(self.name, msg.get("recs", []), msg.get("end", 0))
        elif kind == "state" and msg.get("sub") == "judge":
            pass  # the judge's state.json: its journal says what a console needs
        elif kind == "state" and self.state is not None:
            self.state.apply_supervisor_state(self.name, msg.get("state"))
        elif kind == "gpu" and self.state is not None:
            self.state.apply_telemetry(self.name, msg.get("snap"), msg.get("host"))
        elif kind == "actions" and self.state is not None and msg.get("sub") == self.name:
            self.state.operators.apply_actions(self.name, msg.get("recs"), msg.get("end"),
                                               self.state.add_event)
        elif kind == "consoles" and self.state is not None and msg.get("sub") == self.name:
            self.state.operators.apply_consoles(self.name, msg.get("consoles"))
            self.state.changed(self.name)
        elif kind == "stream_end" and self.state is not None:
            self._stream_ended(msg["sub"], msg["offset"], msg["why"])

    def _stream_ended(self, sub: str, offset: int, why: str) -> None:
        """The agent can read a subscribed journal no further (``stream_end``): an event says
        where, why and where the rest is, once for each place (a reconnect's subscription
        meets the same damage again); the node's state still comes."""
        if sub not in (self.name, "judge") or self.stream_ends.get(sub) == offset:
            return
        self.stream_ends[sub] = offset
        why = clean(why, limit=300)
        if sub == "judge":
            self.state.add_event(None, "stream stopped", "the judge's log stream stopped at "
                                 "journal offset %d: %s (agent error on %s); its later events "
                                 "are not shown" % (offset, why, self.name))
            return
        self.state.nodes[self.name].stream_end = offset
        self.state.add_event(self.name, "stream stopped", "its log stream stopped at journal "
                             "offset %d: %s (agent error); its later lines are in its files on "
                             "the host, under %s/%s/ (torchrun/ holds the ranks')"
                             % (offset, why, clean(self.run_root, limit=200), self.name))
        self.state.changed(self.name)

    async def _reconnect_loop(self) -> None:
        for attempt in itertools.count():
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            try:
                await self.connect()
                if self.subscribed:
                    self.subscribed = False
                    await self.subscribe()
                if self.judge_subscribed:
                    await self.subscribe_judge()
            except (HostUnreachable, AgentError, OSError) as exc:
                if self.state is not None:
                    self.state.set_node(self.name, "unreachable", str(exc))
                continue
            if self.state is not None:
                self.state.add_event(self.name, "reconnected", "connection restored")
            return
