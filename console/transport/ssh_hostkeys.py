"""Host key checking against known_hosts, OpenSSH's way, without ever prompting.

asyncssh matches the presented key against the known_hosts we give it and, only when the key
is not trusted there, asks the client object (``validate_host_public_key``). That is where
this module decides: a host with no key on file is *unknown* (refused, or recorded and let
through with ``--accept-new-host-keys``); a host with a different key on file has a *changed*
key and is always refused. Either way the presented key is kept, so the error can show its
fingerprint — asyncssh's own HostKeyNotVerifiable does not carry the key.
"""

from __future__ import annotations

import os

import asyncssh

from .base import HostUnreachable

ACCEPT_FLAG = "--accept-new-host-keys"
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


def _port_or_none(port: int | None) -> int | None:
    return None if not port or port == 22 else port


def fingerprint(key: asyncssh.SSHKey) -> str:
    """``ssh-ed25519 SHA256:...``, as ``ssh-keygen -l`` and OpenSSH's prompt show it."""
    return "%s %s" % (key.get_algorithm(), key.get_fingerprint("sha256"))


class KnownHosts:
    """The known_hosts files one connection is checked against, and where new keys go."""

    def __init__(self, files: list[str], record_to: str | None, accept_new: bool,
                 parsed: dict | None = None):
        self.files = [os.path.expanduser(f) for f in files]
        self.record_to = os.path.expanduser(record_to) if record_to else None
        self.accept_new = accept_new
        # Parsed files shared by a transport's connections, keyed by path and stat: parsing
        # every key of a big known_hosts once per host would cost O(hosts x lines).
        self.parsed = parsed if parsed is not None else {}

    def existing(self) -> list[str]:
        return [f for f in self.files if os.path.isfile(f)]

    def load(self) -> asyncssh.SSHKnownHosts:
        """Everything on file now; an empty set (not asyncssh's default file) when none."""
        stamps = []
        for path in self.existing():
            st = os.stat(path)
            stamps.append((path, st.st_ino, st.st_mtime_ns, st.st_size))
        key = tuple(stamps)
        known = self.parsed.get(key)
        if known is None:
            known = asyncssh.SSHKnownHosts()
            for path, *_ in stamps:
                with open(path, encoding="utf-8", errors="replace") as f:
                    known.load(f.read())
            self.parsed.clear()  # keep only the latest version of the files
            self.parsed[key] = known
        return known

    def keys_for(self, host: str, addr: str, port: int | None) -> list[asyncssh.SSHKey]:
        return list(self.load().match(host, addr, _port_or_none(port))[0])

    def lines_for(self, host: str, addr: str, port: int | None) -> list[str]:
        """``file:line`` of each entry holding a key for the host (for the changed-key error)."""
        found = []
        for path in self.existing():
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    text = line.strip()
                    if not text or text.startswith("#"):
                        continue
                    try:
                        entry = asyncssh.import_known_hosts(text)
                    except (ValueError, asyncssh.KeyImportError):
                        continue
                    if entry.match(host, addr, _port_or_none(port))[0]:
                        found.append("%s:%d" % (path, number))
        return found

    def record(self, host: str, port: int | None, key: asyncssh.SSHKey) -> None:
        """Append the key in OpenSSH's format (``[host]:port`` for a port other than 22)."""
        assert self.record_to is not None
        pattern = host if not _port_or_none(port) else "[%s]:%d" % (host, port)
        algorithm, blob = key.export_public_key("openssh").decode().split()[:2]
        folder = os.path.dirname(self.record_to)
        if folder:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        prefix = ""
        if os.path.isfile(self.record_to) and os.path.getsize(self.record_to):
            with open(self.record_to, "rb") as f:
                f.seek(-1, os.SEEK_END)
                prefix = "" if f.read(1) == b"\n" else "\n"
        with open(self.record_to, "a", encoding="utf-8") as f:
            f.write("%s%s %s %s\n" % (prefix, pattern, algorithm, blob))


class HostKeyClient(asyncssh.SSHClient):
    """The asyncssh client object of one connection: host key verdicts and loss notice."""

    def __init__(self, known: KnownHosts, on_lost=None):
        self.known = known
        self.on_lost = on_lost
        self.verdict: str | None = None  # unknown, changed, recorded, record-failed
        self.presented: asyncssh.SSHKey | None = None
        self.where = ("", "", 22)
        self.record_error = ""

    def validate_host_public_key(self, host, addr, port, key) -> bool:
        self.presented = key
        self.where = (host, addr, port)
        if self.known.keys_for(host, addr, port):
            self.verdict = "changed"
            return False
        if not self.known.accept_new:
            self.verdict = "unknown"
            return False
        if self.known.record_to is None:  # UserKnownHostsFile none: trust for this run only
            self.verdict = "recorded"
            return True
        try:
            self.known.record(host, port, key)
        except OSError as exc:
            self.verdict, self.record_error = "record-failed", str(exc)
            return False
        self.verdict = "recorded"
        return True

    def connection_lost(self, exc) -> None:
        if self.on_lost is not None:
            self.on_lost(exc)

    def failure(self, label: str) -> HostUnreachable | None:
        """The HostUnreachable for a refused host key, or None if the key was not the problem."""
        if self.presented is None or self.verdict not in ("unknown", "changed", "record-failed"):
            return None
        shown = fingerprint(self.presented)
        where = self.known.record_to or "known_hosts"
        if self.verdict == "unknown":
            return HostUnreachable("hostkey", "%s: host key not known: %s; check it, then rerun "
                                   "with %s to record it in %s"
                                   % (label, shown, ACCEPT_FLAG, where))
        if self.verdict == "record-failed":
            return HostUnreachable("hostkey", "%s: host key %s could not be recorded in %s: %s"
                                   % (label, shown, where, self.record_error))
        host, addr, port = self.where
        lines = ", ".join(self.known.lines_for(host, addr, port)) or where
        return HostUnreachable("hostkey", "%s: host key CHANGED: the host now presents %s, but %s "
                               "holds a different key for it; refused even with %s. If the host "
                               "was reinstalled, remove that entry (ssh-keygen -R %s) and "
                               "reconnect; otherwise someone may be intercepting the connection"
                               % (label, shown, lines, ACCEPT_FLAG, host))
