"""The interface every transport implements: open a byte stream to an agent `serve` on a host.

A transport knows how to reach a host and start ``python -m agent serve`` there with the
host's interpreter; it knows nothing about the protocol spoken over the stream. The console's
NodeLink speaks the protocol (agent/wire/protocol.py) over whatever :meth:`Transport.open` returns.
"""

from __future__ import annotations

import abc


class HostUnreachable(Exception):
    """A host could not be reached or the agent could not be started there.

    ``cause`` is one short word a user can act on: dns, refused, timeout, auth, hostkey,
    no-python, python-too-old, agent-failed, closed, protocol (the agent sent something that
    is not a well-formed message), error. ``str()`` is the full message.
    """

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


class AgentStream(abc.ABC):
    """A live byte stream to one agent ``serve`` process. ``frames``: whether it can read
    :meth:`readexactly` (a console then asks for journal records as raw bytes, ``jbytes``)."""

    frames = False

    @abc.abstractmethod
    async def readline(self) -> bytes:
        """One line (newline included); b"" at end of stream."""

    async def readexactly(self, n: int) -> bytes:
        """The next ``n`` bytes; ConnectionError when the stream ends before them."""
        raise NotImplementedError

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Queue bytes for the agent."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Wait until queued bytes are handed to the OS / channel."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the stream; the agent's `serve` exits (its supervisors do not)."""


class Transport(abc.ABC):
    """Opens agent streams to the hosts of an inventory."""

    @abc.abstractmethod
    async def open(self, host) -> AgentStream:
        """Start `serve` on ``host`` (an inventory Host); raise HostUnreachable with a cause."""

    def expected_agent(self) -> tuple[str, str] | None:
        """The agent version this transport starts on hosts and where that copy lives on them,
        for NodeLink's hello check; None when the hosts run this console's own agent package
        (the local transport), so there is no copy to go stale."""
        return None

    async def close(self) -> None:
        """Release shared resources (SSH connections)."""
