"""The agent stream over one SSH channel, and the background reader of its stderr."""

from __future__ import annotations

import asyncio
import json

import asyncssh

from .base import AgentStream, HostUnreachable

STDERR_TAIL = 8192
MAX_MESSAGE = 16 * 1024 * 1024  # longest line taken from an agent (as the local transport)
READ_CHUNK = 65536


class StderrTail:
    """Reads a stream to its end in the background, keeping only the last bytes."""

    def __init__(self, reader: asyncssh.SSHReader):
        self.data = bytearray()
        self.task = asyncio.ensure_future(self._run(reader))

    async def _run(self, reader) -> None:
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                self.data += chunk
                del self.data[:-STDERR_TAIL]
        except (OSError, asyncssh.Error):
            return

    async def text(self, wait: float = 0.0) -> str:
        if wait:
            await asyncio.wait([self.task], timeout=wait)
        return bytes(self.data).decode("utf-8", "replace")


class SshAgentStream(AgentStream):
    """An agent ``serve`` on one host over one SSH channel (bytes, one JSON message a line;
    a ``jbytes`` message's raw bytes follow its line).

    The hello the transport checked is handed out again as the first :meth:`readline`, so the
    protocol layer reads every message itself. ``hello`` (the parsed message) and ``copied``
    (whether this open installed the agent on the host) are for callers and tests.
    """

    frames = True

    def __init__(self, process: asyncssh.SSHClientProcess, label: str, hello_line: bytes,
                 stderr: StderrTail, copied: bool):
        self.process = process
        self.label = label
        self.hello = json.loads(hello_line)
        self.copied = copied
        self._first: list[bytes] = [hello_line]
        self._buffer = bytearray()  # read but not yet handed out
        self._scanned = 0  # how much of it is known to hold no newline
        self._stderr = stderr
        self._closed = False

    def _lost(self, exc: BaseException) -> HostUnreachable:
        return HostUnreachable("closed", "%s: the SSH connection to the agent broke: %s"
                               % (self.label, exc))

    async def readline(self) -> bytes:
        """One line, at most MAX_MESSAGE bytes: a longer one raises HostUnreachable
        ("protocol") rather than filling the console's memory with one host's line."""
        if self._first:
            return self._first.pop()
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(buffer[:end + 1])
                del buffer[:end + 1]
                self._scanned = 0
                return line
            self._scanned = len(buffer)
            if len(buffer) > MAX_MESSAGE:
                buffer.clear()
                self._scanned = 0
                raise HostUnreachable("protocol", "%s: the agent sent a line over %d KiB"
                                      % (self.label, MAX_MESSAGE >> 10))
            try:
                chunk = await self.process.stdout.read(READ_CHUNK)
            except (OSError, asyncssh.Error) as exc:
                raise self._lost(exc) from exc
            if not chunk:  # end of stream: what is left, then b""
                line = bytes(buffer)
                buffer.clear()
                self._scanned = 0
                return line
            buffer += chunk

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes (the caller bounds ``n``: agent_messages.MAX_FRAME)."""
        buffer = self._buffer
        while len(buffer) < n:
            try:
                chunk = await self.process.stdout.read(max(READ_CHUNK, n - len(buffer)))
            except (OSError, asyncssh.Error) as exc:
                raise self._lost(exc) from exc
            if not chunk:
                raise ConnectionError("the agent's output ended inside a message")
            buffer += chunk
        data = bytes(buffer[:n])
        del buffer[:n]
        self._scanned = 0
        return data

    def write(self, data: bytes) -> None:
        try:
            self.process.stdin.write(data)
        except (OSError, asyncssh.Error) as exc:
            raise self._lost(exc) from exc

    async def drain(self) -> None:
        try:
            await self.process.stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            raise self._lost(exc) from exc

    @property
    def exit_status(self) -> int | None:
        return self.process.exit_status

    async def close(self) -> None:
        """EOF to ``serve`` (it exits on it, its supervisors do not), then close the channel."""
        if self._closed:
            return
        self._closed = True
        try:
            self.process.stdin.write_eof()
        except (OSError, asyncssh.Error):
            pass
        self.process.close()
        try:
            await asyncio.wait_for(self.process.wait_closed(), 5)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            pass
        finally:  # also when the close itself is cancelled
            self._stderr.task.cancel()
