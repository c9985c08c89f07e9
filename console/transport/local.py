"""The local transport: agent `serve` as a subprocess on this machine (the demo, tests).

Every "host" of a local inventory is this machine; nodes differ by their loopback address
(127.0.0.2, 127.0.0.3, ...). The agent runs from this checkout with the host's interpreter.
"""

from __future__ import annotations

import asyncio
import os
import sys

import agent
from .base import AgentStream, HostUnreachable, Transport

AGENT_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(agent.__file__)))
STREAM_LIMIT = 16 * 1024 * 1024


class ProcessStream(AgentStream):
    frames = True

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    async def readline(self) -> bytes:
        try:
            return await self.proc.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise HostUnreachable("protocol", "agent sent a line over the size limit")

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self.proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError:
            raise ConnectionError("the agent's output ended inside a message") from None

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)

    async def drain(self) -> None:
        await self.proc.stdin.drain()

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
            except asyncio.CancelledError:  # e.g. NodeLink.close() ending a reader that was
                self.proc.kill()            # closing this stream: reap it, leave nothing behind
                await self.proc.wait()
                raise


class LocalTransport(Transport):
    async def open(self, host) -> AgentStream:
        python = host.python or sys.executable
        env = dict(os.environ)
        env["PYTHONPATH"] = AGENT_PARENT
        try:
            proc = await asyncio.create_subprocess_exec(
                python, "-m", "agent", "serve",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, env=env, cwd=AGENT_PARENT,
                limit=STREAM_LIMIT,
            )
        except FileNotFoundError:
            raise HostUnreachable("no-python", "%s: python %r not found; set `python:` in the "
                                  "inventory" % (host.name, python)) from None
        return ProcessStream(proc)
