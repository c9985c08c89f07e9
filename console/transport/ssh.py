"""The SSH transport: asyncssh to each host, the agent copied there once, ``serve`` started.

It honours the user's ``~/.ssh/config`` (aliases, User, Port, IdentityFile, ProxyJump),
ssh-agent and known_hosts, and never prompts: password and keyboard-interactive logins are off,
an unknown host key is refused unless the user opted in, a changed one is always refused
(ssh_hostkeys.py). One SSH connection per host is kept and shared by its channels (the agent
stream, commands), and one per jump host, shared by every host behind it; :meth:`close`
closes them all. Failures become :class:`HostUnreachable` with one cause word
(ssh_errors.py). No Textual here.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from dataclasses import dataclass

import asyncssh

from agent.wire import protocol

from ..lines.sanitize import clean
from .agent_copy import SEND_MARKER, AgentBundle
from .base import AgentStream, HostUnreachable, Transport
from .ssh_errors import connect_error, host_label, start_error
from .ssh_hostkeys import GLOBAL_KNOWN_HOSTS, HostKeyClient, KnownHosts
from .ssh_stream import SshAgentStream, StderrTail

# Never a prompt: no passwords, no keyboard-interactive. Keepalives notice a dead link within
# about 6-8 s (a lost host must show as unreachable within 10 s).
DEFAULT_OPTIONS = {
    "password_auth": False,
    "kbdint_auth": False,
    "keepalive_interval": 2,
    "keepalive_count_max": 3,
}
MAX_NOISE_LINES = 50  # lines a login script may print before the agent's first line
MAX_JUMP_DEPTH = 4


def parse_target(spec: str) -> tuple[str, int | None, str | None]:
    """``[user@]host[:port]`` or ``[v6addr]:port`` -> (host, port, user); an alias stays whole."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("[") and "]" in spec:
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return host, port, user
    if spec.count(":") == 1:
        host, _, port_text = spec.partition(":")
        if port_text.isdigit():
            return host, int(port_text), user
    return spec, None, user


@dataclass
class _Link:
    """One SSH connection and how to name its host in messages."""

    conn: asyncssh.SSHClientConnection
    label: str
    closed: bool = False


class SshTransport(Transport):
    """Opens agent streams over SSH; see the module docstring.

    ``ssh_config``/``known_hosts``: a path (or list), or None for the user's defaults
    (``~/.ssh/config`` if it exists; known_hosts from the config or ``~/.ssh/known_hosts``, plus
    ``/etc/ssh/ssh_known_hosts``). ``client_keys``: key paths, or None for asyncssh's defaults
    (config IdentityFile, ``~/.ssh/id_*``, ssh-agent). ``remote_cache``: where agent copies live
    on the hosts. ``connect_timeout`` bounds connect + login, ``start_timeout`` the agent's
    start. ``options``: extra asyncssh connect options, which win over the defaults.
    """

    def __init__(self, accept_new_host_keys: bool = False, connect_timeout: float = 10,
                 ssh_config=None, known_hosts=None, client_keys=None,
                 remote_cache: str = "~/.cache/rankdeck", start_timeout: float = 30,
                 options: dict | None = None, bundle: AgentBundle | None = None):
        self.accept_new_host_keys = accept_new_host_keys
        self.connect_timeout = connect_timeout
        self.ssh_config = ssh_config
        self.known_hosts = known_hosts
        self.client_keys = client_keys
        self.remote_cache = remote_cache
        self.start_timeout = start_timeout
        self.options = {**DEFAULT_OPTIONS, **(options or {})}
        self._bundle = bundle
        self._links: dict[tuple, asyncio.Future] = {}
        self._parsed_known_hosts: dict = {}

    @property
    def bundle(self) -> AgentBundle:
        if self._bundle is None:
            self._bundle = AgentBundle.from_local()
        return self._bundle

    # -- connections -----------------------------------------------------------------------
    def _config_paths(self) -> list[str]:
        if self.ssh_config is None:
            default = os.path.expanduser("~/.ssh/config")
            return [default] if os.path.isfile(default) else []
        paths = [self.ssh_config] if isinstance(self.ssh_config, (str, os.PathLike)) \
            else list(self.ssh_config)
        return [os.path.expanduser(str(p)) for p in paths]

    def _known_hosts_for(self, opts: asyncssh.SSHClientConnectionOptions) -> KnownHosts:
        if self.known_hosts is not None:
            files = [self.known_hosts] if isinstance(self.known_hosts, (str, os.PathLike)) \
                else list(self.known_hosts)
            files = [str(f) for f in files]
            return KnownHosts(files, files[0] if files else None, self.accept_new_host_keys,
                              self._parsed_known_hosts)
        configured = opts.known_hosts  # from UserKnownHostsFile; None means "none"
        if configured is None:
            return KnownHosts([], None, self.accept_new_host_keys, self._parsed_known_hosts)
        files = [str(f) for f in configured] or [os.path.expanduser("~/.ssh/known_hosts")]
        return KnownHosts(files + list(GLOBAL_KNOWN_HOSTS), files[0], self.accept_new_host_keys,
                          self._parsed_known_hosts)

    async def _shared(self, key: tuple, dial) -> _Link:
        """The connection under ``key``, dialled once; concurrent callers wait on the same one."""
        fut = self._links.get(key)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None
                                           or fut.result().closed)):
            fut = asyncio.ensure_future(dial())
            self._links[key] = fut
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if fut.done() and self._links.get(key) is fut:
                del self._links[key]
            raise

    async def _link(self, host) -> _Link:
        spec = host.ssh or host.name
        return await self._shared(("host", host.name, spec), lambda: self._dial(host.name, spec))

    async def _jump(self, chain: str, depth: int) -> asyncssh.SSHClientConnection:
        """The last hop of a ProxyJump chain ``a,b``: one shared connection per hop."""
        conn = None
        hops = [h.strip() for h in chain.split(",") if h.strip()]
        for i, hop in enumerate(hops):
            key = ("jump", ",".join(hops[:i + 1]))
            conn = (await self._shared(key, lambda hop=hop, via=conn: self._dial(
                "jump host " + hop, hop, via=via, depth=depth))).conn
        return conn

    async def _dial(self, name: str, spec: str, via=None, depth: int = 0) -> _Link:
        target, port, user = parse_target(spec)
        kwargs = dict(self.options)
        if port:
            kwargs["port"] = port
        if user:
            kwargs["username"] = user
        if self.client_keys is not None:
            kwargs["client_keys"] = [str(k) if isinstance(k, os.PathLike) else k
                                     for k in self.client_keys]
        label = host_label(name, target, port)
        try:
            opts = await asyncssh.SSHClientConnectionOptions.construct(
                config=self._config_paths(), host=target, **kwargs)
        except (OSError, asyncssh.Error, ValueError) as exc:
            raise connect_error(exc, label, port=port, user=user,
                                timeout=self.connect_timeout) from exc
        label = host_label(name, opts.host, opts.port)
        tunnel = via or ()
        jump = opts.tunnel if isinstance(opts.tunnel, str) else None
        if via is None and jump and jump.lower() != "none":
            # asyncssh would dial the jump host anew for every host behind it (and with its
            # defaults, not ours); 64 handshakes at once trip the bastion's MaxStartups.
            if depth >= MAX_JUMP_DEPTH:
                raise HostUnreachable("error", "%s: ProxyJump nests deeper than %d hops"
                                      % (label, MAX_JUMP_DEPTH))
            try:
                tunnel = await self._jump(jump, depth + 1)
            except HostUnreachable as exc:
                raise HostUnreachable(exc.cause, "%s: %s" % (label, exc)) from exc
        known = self._known_hosts_for(opts)
        link: _Link | None = None

        def lost(_exc) -> None:
            if link is not None:
                link.closed = True

        client = HostKeyClient(known, on_lost=lost)
        try:
            conn = await asyncio.wait_for(
                asyncssh.connect(target, port or (), options=opts, tunnel=tunnel,
                                 known_hosts=known.load(), client_factory=lambda: client),
                self.connect_timeout)
        except (OSError, asyncssh.Error, asyncio.TimeoutError, ValueError) as exc:
            failure = client.failure(label) if isinstance(exc, asyncssh.HostKeyNotVerifiable) \
                else None
            raise (failure or connect_error(exc, label, port=opts.port, user=opts.username,
                                            timeout=self.connect_timeout)) from exc
        link = _Link(conn, label)
        return link

    async def _channel(self, link: _Link, command: str, **kw) -> asyncssh.SSHClientProcess:
        """A new session channel; a connection that cannot open one is dropped from the cache."""
        try:
            return await asyncio.wait_for(link.conn.create_process(command, **kw),
                                          self.connect_timeout)
        except asyncio.TimeoutError:
            link.closed = True
            link.conn.abort()
            raise HostUnreachable("timeout", "%s: the SSH connection stopped answering (no "
                                  "channel within %g s)" % (link.label, self.connect_timeout)
                                  ) from None
        except (OSError, asyncssh.Error) as exc:
            link.closed = True
            raise HostUnreachable("closed", "%s: cannot open an SSH channel: %s"
                                  % (link.label, exc)) from exc

    # -- agent -----------------------------------------------------------------------------
    async def open(self, host) -> SshAgentStream:
        """Connect (or reuse the connection), install the agent if missing, start ``serve``.

        The agent's hello (told apart from a login script's output here) is handed on as the
        stream's first line; NodeLink checks it. Raises HostUnreachable; its cause says which
        step failed (see ssh_errors.py).
        """
        link = await self._link(host)
        process = await self._channel(link, self.serve_command(host), encoding=None)
        stderr = StderrTail(process.stderr)
        try:
            hello, copied = await asyncio.wait_for(
                self._await_hello(process, link.label, host, stderr), self.start_timeout)
        except asyncio.TimeoutError:
            process.close()
            tail = [clean(line) for line in (await stderr.text()).strip().splitlines()[-3:]]
            raise HostUnreachable("agent-failed", "%s: the agent sent no hello within %g s%s"
                                  % (link.label, self.start_timeout,
                                     ": " + " | ".join(tail) if tail else "")) from None
        except HostUnreachable:
            process.close()
            raise
        except (OSError, asyncssh.Error) as exc:
            process.close()
            raise HostUnreachable("closed", "%s: the connection broke while starting the agent:"
                                  " %s" % (link.label, exc)) from exc
        except asyncio.CancelledError:  # a caller's timeout or a close(): end what was started
            process.close()
            raise
        return SshAgentStream(process, link.label, hello, stderr, copied)

    def serve_command(self, host) -> str:
        """The shell command line that starts ``serve`` for ``host`` on the far side
        (console/transport/slurm.py wraps it in ``srun``)."""
        return self.bundle.remote_command(host.python or "python3", self.remote_cache)

    async def _await_hello(self, process, label: str, host, stderr: StderrTail):
        """Read up to the hello, sending the agent's files if the host asks for them."""
        bundle, copied, noise = self.bundle, False, []
        while True:
            line = await process.stdout.readline()
            if not line:
                try:  # the exit status arrives just after the end of output
                    await asyncio.wait_for(process.wait_closed(), 5)
                except asyncio.TimeoutError:
                    pass
                raise start_error(label, host.python, process.exit_status,
                                  await stderr.text(wait=2),
                                  b"".join(noise).decode("utf-8", "replace"))
            if line.startswith(SEND_MARKER) and not copied:
                process.stdin.write(bundle.framed())
                await process.stdin.drain()
                copied = True
                continue
            if line.startswith(b"{"):
                try:
                    msg = protocol.decode(line)
                except protocol.ProtocolError:
                    msg = None
                if msg is not None and msg.get("t") == "hello":
                    return line, copied  # NodeLink checks what it says
            noise.append(line)  # a chatty login script; give up if it never stops
            if len(noise) > MAX_NOISE_LINES:
                raise HostUnreachable("agent-failed", "%s: no agent hello, only other output: %s"
                                      % (label, clean(line[:200].decode("utf-8", "replace")
                                                      .strip())))

    def expected_agent(self) -> tuple[str, str]:
        version = self.bundle.version
        return version, "%s/agent-%s" % (self.remote_cache.rstrip("/"), version)

    # -- commands --------------------------------------------------------------------------
    async def run_command(self, host, command, timeout: float | None = None,
                          input: str | None = None) -> tuple[int, str, str]:
        """Run one command on the host over its shared connection (preflight, py-spy).

        ``command`` is a shell string or an argv list (quoted for the remote shell). Returns
        (exit status, stdout, stderr); exit status -1 when the command died by a signal.
        """
        link = await self._link(host)
        if not isinstance(command, str):
            command = " ".join(shlex.quote(str(arg)) for arg in command)
        process = await self._channel(link, command, encoding="utf-8", errors="replace")
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(input), timeout)
            await process.wait_closed()
        except asyncio.TimeoutError:
            process.close()
            raise HostUnreachable("timeout", "%s: `%s` did not finish within %g s"
                                  % (link.label, command, timeout)) from None
        except (OSError, asyncssh.Error) as exc:
            raise HostUnreachable("closed", "%s: the connection broke running `%s`: %s"
                                  % (link.label, command, exc)) from exc
        status = process.exit_status if process.exit_status is not None else -1
        return status, stdout or "", stderr or ""

    async def close(self) -> None:
        links = [fut.result() for fut in self._links.values()
                 if fut.done() and not fut.cancelled() and fut.exception() is None]
        for fut in self._links.values():
            if not fut.done():
                fut.cancel()
        self._links.clear()
        for link in links:
            link.conn.close()
        await asyncio.gather(*(link.conn.wait_closed() for link in links),
                             return_exceptions=True)


async def open_all(transport: Transport, hosts, timeout: float | None = None
                   ) -> dict[str, AgentStream | HostUnreachable]:
    """Open every host at once; each host's failure is its own and never blocks the others.

    ``timeout`` bounds each host (the SSH transport already bounds connect and start itself).
    Anything that is not a HostUnreachable (a bug) is reported as cause "error" for its host.
    """
    async def one(host):
        if timeout is None:
            return await transport.open(host)
        try:
            return await asyncio.wait_for(transport.open(host), timeout)
        except asyncio.TimeoutError:
            raise HostUnreachable("timeout", "%s: not ready within %g s"
                                  % (host.name, timeout)) from None

    results = await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)
    out: dict[str, AgentStream | HostUnreachable] = {}
    for host, result in zip(hosts, results):
        if isinstance(result, BaseException) and not isinstance(result, HostUnreachable):
            error = HostUnreachable("error", "%s: unexpected error: %r" % (host.name, result))
            error.__cause__ = result
            result = error
        out[host.name] = result
    return out
