"""Turn what went wrong reaching a host into one HostUnreachable a user can act on.

Every message starts with the host, says what happened in one line and what to do about it.
The cause is one word (see HostUnreachable): dns, refused, timeout, unreachable, auth, hostkey,
no-python, python-too-old, agent-failed, closed, error.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import socket

import asyncssh

from ..lines.sanitize import clean
from .base import HostUnreachable

_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]")
_TOO_OLD = re.compile(r"needs Python >= 3\.8, this is (\d+\.\d+)")
_REFUSED = (errno.ECONNREFUSED,)
_UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN)
_TIMEDOUT = (errno.ETIMEDOUT,)


def host_label(name: str, hostname: str | None, port: int | None) -> str:
    """``node1 (10.77.0.12)``, ``node1 (10.77.0.12:2222)``; just ``node1`` if nothing to add."""
    if not hostname:
        return name
    shown = hostname if not port or port == 22 else "%s:%d" % (hostname, port)
    return name if shown == name else "%s (%s)" % (name, shown)


def _errnos(exc: OSError) -> set[int]:
    """The errno(s) of an OSError, including asyncio's "Multiple exceptions: ..." kind."""
    found = {exc.errno} if exc.errno else set()
    found.update(int(n) for n in _ERRNO_IN_TEXT.findall(str(exc)))
    return found


def connect_error(exc: BaseException, label: str, *, port: int | None, user: str | None,
                  timeout: float) -> HostUnreachable:
    """A failure to connect or log in. ``exc`` is what asyncssh or the socket layer raised."""
    port = port or 22
    if isinstance(exc, HostUnreachable):
        return exc
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) and not (
            isinstance(exc, OSError) and exc.errno):
        return HostUnreachable("timeout", "%s: no answer within %g s on port %d: the host is "
                               "down, the address is wrong, or a firewall drops SSH"
                               % (label, timeout, port))
    if isinstance(exc, socket.gaierror):
        return HostUnreachable("dns", "%s: cannot resolve the host name (%s): check `ssh:` in "
                               "the inventory or HostName in ~/.ssh/config"
                               % (label, exc.strerror or exc))
    if isinstance(exc, OSError):
        codes = _errnos(exc)
        if codes & set(_REFUSED):
            return HostUnreachable("refused", "%s: connection refused on port %d: is sshd running "
                                   "there, on that port?" % (label, port))
        if codes & set(_UNREACHABLE):
            reason = os.strerror(min(codes & set(_UNREACHABLE)))
            return HostUnreachable("unreachable", "%s: cannot reach the host (%s): check the "
                                   "address and the network (VPN?)" % (label, reason))
        if codes & set(_TIMEDOUT):
            return HostUnreachable("timeout", "%s: connection timed out on port %d: the host is "
                                   "down or a firewall drops SSH" % (label, port))
        return HostUnreachable("error", "%s: cannot connect: %s" % (label, exc))
    if isinstance(exc, asyncssh.PermissionDenied):
        return HostUnreachable("auth", "%s: permission denied for user %s (publickey): add your "
                               "public key to ~/.ssh/authorized_keys on the host, or load the "
                               "right key with ssh-add / IdentityFile" % (label, user or "?"))
    if isinstance(exc, asyncssh.KeyImportError):
        return HostUnreachable("auth", "%s: cannot load a client key: %s (keys with a passphrase "
                               "must be in ssh-agent)" % (label, exc))
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return HostUnreachable("hostkey", "%s: host key not verified: %s; check it, then rerun "
                               "with --accept-new-host-keys" % (label, exc.reason))
    if isinstance(exc, asyncssh.ChannelOpenError):
        # A ProxyJump host could not reach the target; its reason is the socket error there.
        reason = exc.reason.lower()
        cause = ("refused" if "refused" in reason else
                 "unreachable" if "route" in reason or "unreachable" in reason else
                 "timeout" if "timed out" in reason else
                 "dns" if "resolve" in reason or "name" in reason else "error")
        return HostUnreachable(cause, "%s: the jump host could not connect: %s"
                               % (label, exc.reason))
    if isinstance(exc, asyncssh.DisconnectError):
        return HostUnreachable("closed", "%s: the SSH connection was closed: %s"
                               % (label, exc.reason))
    if isinstance(exc, asyncssh.Error):
        return HostUnreachable("error", "%s: SSH error: %s" % (label, exc))
    if isinstance(exc, ValueError):  # a bad ssh_config line or option, found while connecting
        return HostUnreachable("error", "%s: bad SSH settings: %s" % (label, exc))
    return HostUnreachable("error", "%s: %s" % (label, exc))


def start_error(label: str, python: str, exit_status: int | None, stderr: str,
                noise: str = "") -> HostUnreachable:
    """The agent did not say hello: no interpreter, too old a one, or a crash."""
    # the host's own text, printed and shown: cleaned of escapes like a log line
    tail = " | ".join(clean(line) for line in stderr.strip().splitlines()[-6:] if line.strip())
    too_old = _TOO_OLD.search(stderr)
    if too_old:
        return HostUnreachable("python-too-old", "%s: %s is Python %s; the agent needs >= 3.8: "
                               "set `python:` for this host in the inventory to a newer "
                               "interpreter"
                               % (label, python, too_old.group(1)))
    if exit_status in (126, 127):  # the shell's "not found" / "not executable"
        return HostUnreachable("no-python", "%s: python %r not found on the host (exit %s: %s): "
                               "set `python:` in the inventory to the training interpreter's path"
                               % (label, python, exit_status, tail or "no output"))
    detail = tail or clean((noise.strip().splitlines() or ["no output"])[-1])
    return HostUnreachable("agent-failed", "%s: the agent exited before its hello (exit %s): %s"
                           % (label, exit_status, detail))
