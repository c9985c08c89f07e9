"""NodeLink: the console's connection to one node's agent, with requests and reconnects.

It speaks agent/protocol.py over an AgentStream from any transport, feeds pushed journal and
state messages into RunState in arrival order, and after a dropped connection reconnects by
itself and resubscribes from the journal offset RunState has seen: every record arrives
exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from agent import protocol
from .state import RunState
from .transport.base import AgentStream, HostUnreachable, Transport

log = logging.getLogger("rankdeck.link")
HELLO_TIMEOUT = 60.0
BACKOFF = (0.5, 1.0, 2.0, 3.0, 5.0)


class AgentError(Exception):
    """A request the agent refused or failed; ``kind`` says what sort (usage, conflict...)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


class NodeLink:
    def __init__(self, host, transport: Transport, state: RunState | None, run_root: str,
                 reconnect: bool = True, gpu: bool = True):
        self.host = host
        self.name = host.name
        self.transport = transport
        self.state = state
        self.run_root = run_root
        self.reconnect = reconnect
        self.stream: AgentStream | None = None
        self.hello: dict | None = None
        self.subscribed = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._reconnecting: asyncio.Task | None = None
        self._closing = False
        self.connected = asyncio.Event()
        self.on_message = None  # optional callback(msg) for messages RunState does not take
        self.quiet_until = 0  # first subscription: skip log lines before this journal offset

    # -- connection ------------------------------------------------------------------------
    async def connect(self) -> dict:
        """Open the stream and read the agent's hello. Raises HostUnreachable."""
        stream = await self.transport.open(self.host)
        try:
            line = await asyncio.wait_for(stream.readline(), HELLO_TIMEOUT)
        except asyncio.TimeoutError:
            await stream.close()
            raise HostUnreachable("agent-failed", "%s: agent sent no hello within %d s"
                                  % (self.name, HELLO_TIMEOUT)) from None
        if not line:
            await stream.close()
            raise HostUnreachable("agent-failed", "%s: agent exited before its hello; run "
                                  "`rankdeck check` for the cause" % self.name)
        try:
            hello = protocol.decode(line)
        except protocol.ProtocolError as exc:
            await stream.close()
            raise HostUnreachable("agent-failed", "%s: %s" % (self.name, exc)) from None
        if hello.get("t") != "hello" or hello.get("proto") != protocol.PROTOCOL_VERSION:
            await stream.close()
            raise HostUnreachable("agent-failed", "%s: agent speaks protocol %s, this console "
                                  "speaks %s" % (self.name, hello.get("proto"),
                                                 protocol.PROTOCOL_VERSION))
        self.stream = stream
        self.hello = hello
        self._reader = asyncio.ensure_future(self._read_loop(stream))
        self.connected.set()
        return hello

    async def close(self) -> None:
        self._closing = True
        for task in (self._reconnecting, self._reader):
            if task is not None and not task.done():
                task.cancel()
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
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise AgentError("%s: %s got no answer within %s s" % (self.name, op, timeout),
                             "timeout") from None
        finally:
            self._pending.pop(req_id, None)

    async def subscribe(self) -> dict:
        offset = self.state.nodes[self.name].journal_offset if self.state else 0
        if self.state and offset == 0:
            self.state.nodes[self.name].data_from = self.quiet_until
        data = await self.request("subscribe", run_root=self.run_root, node=self.name,
                                  sub=self.name, offset=offset, quiet_until=self.quiet_until)
        self.subscribed = True
        return data

    # -- incoming --------------------------------------------------------------------------
    async def _read_loop(self, stream: AgentStream) -> None:
        try:
            while True:
                line = await stream.readline()
                if not line:
                    break
                msg = protocol.decode(line)
                self._dispatch(msg)
        except (HostUnreachable, protocol.ProtocolError, ConnectionError, OSError) as exc:
            log.warning("%s: stream broke: %s", self.name, exc)
        except asyncio.CancelledError:
            raise
        if self._closing:
            return
        self.connected.clear()
        self.stream = None
        self._fail_pending(AgentError("%s: connection lost" % self.name, "closed"))
        if self.state is not None:
            self.state.set_node(self.name, "unreachable", "connection lost; reconnecting")
            self.state.add_event(self.name, "unreachable", "connection lost; reconnecting")
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
                    fut.set_exception(AgentError("%s: %s" % (self.name, msg.get("error")),
                                                 msg.get("kind", "error")))
        elif kind == "journal" and self.state is not None:
            self.state.apply_records(self.name, msg.get("recs", []), msg.get("end", 0))
        elif kind == "state" and self.state is not None:
            self.state.apply_supervisor_state(self.name, msg.get("state"))
        elif kind == "gpu" and self.state is not None:
            self.state.nodes[self.name].gpu = msg.get("snap")
            self.state.changed(self.name)
        elif self.on_message is not None:
            self.on_message(msg)

    async def _reconnect_loop(self) -> None:
        for attempt in itertools.count():
            await asyncio.sleep(BACKOFF[min(attempt, len(BACKOFF) - 1)])
            try:
                await self.connect()
                if self.subscribed:
                    self.subscribed = False
                    await self.subscribe()
            except (HostUnreachable, AgentError, OSError) as exc:
                if self.state is not None:
                    self.state.set_node(self.name, "unreachable", str(exc))
                continue
            if self.state is not None:
                self.state.add_event(self.name, "reconnected", "connection restored")
            return
