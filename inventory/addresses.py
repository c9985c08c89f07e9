"""What a host's name, ssh target and addr may be: the rules the inventory's checks and the
hostfile reader share."""

from __future__ import annotations

import ipaddress
import re

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
DIGITS = re.compile(r"[0-9]+\Z")
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def ssh_host(target: str) -> str | None:
    """The host part of ``[user@]host[:port]`` (``[v6addr]:port`` too); None if malformed."""
    if not target or any(c.isspace() for c in target):
        return None
    rest = target.rpartition("@")[2]
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        if port and not port.startswith(":"):
            return None
        port = port[1:]
    elif rest.count(":") == 1:
        host, _, port = rest.partition(":")
    else:
        host, port = rest, ""  # an alias, a hostname, or a bare IPv6 address
    if not host or (port and not (DIGITS.match(port) and 1 <= int(port) <= 65535)):
        return None
    return host


def addr_problem(addr: str) -> str | None:
    """Why ``addr`` is not one hostname or IP address (it becomes torchrun's --local-addr and
    the rendezvous host), or None."""
    if any(c.isspace() for c in addr):
        return "contains a space; write one hostname or IP address"
    if addr.startswith("[") and addr.endswith("]"):
        return f"has brackets; write the address alone: {addr[1:-1]}"
    try:
        ipaddress.ip_address(addr)
        return None
    except ValueError:
        pass
    host, colon, port = addr.rpartition(":")
    if colon and DIGITS.match(port) and "]" not in host and ":" not in host:
        return (f"has a port; addr is the node's address alone ({host}), the rendezvous port "
                "is rankdeck's to choose")
    if not HOST_NAME.match(addr):
        return ("is not a hostname or IP address; use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit")
    return None


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.IPv4Address(addr) in _LOOPBACK
    except ValueError:
        return False


def listen_address(text: str) -> tuple[str | None, int]:
    """``PORT``, ``ADDR:PORT`` or ``[IPv6]:PORT`` (``launch --prometheus``, the inventory's
    ``prometheus:``) as ``(addr or None, port)``; ValueError saying what to write."""
    text = text.strip()
    addr, colon, port = text.rpartition(":")
    if addr.startswith("[") and addr.endswith("]"):
        addr = addr[1:-1]
        try:
            ipaddress.IPv6Address(addr)
        except ValueError:
            raise ValueError(f"{text!r}: {addr!r} in brackets is not an IPv6 address") from None
    elif colon and (":" in addr or not addr or addr_problem(addr)):
        raise ValueError(f"{text!r}: write PORT, ADDR:PORT or [IPv6]:PORT with ADDR one "
                         "hostname or IP address")
    if not DIGITS.match(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535; write PORT, "
                         "ADDR:PORT or [IPv6]:PORT")
    return (addr or None), int(port)
