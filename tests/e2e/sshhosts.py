"""Real OpenSSH hosts in network namespaces, for e2e tests and benchmarks (root only).

``create_hosts(n)`` builds, on this machine:

- a Linux bridge ``rdk<id>br`` in the root namespace with ``10.77.X.1/24`` (X picked free, under
  a lock, so parallel sessions do not collide; ``<id>`` is random per session);
- per host a namespace ``rdk<id>-nodeK``, a veth pair (``eth0`` inside, on the bridge outside)
  with ``10.77.X.(11+K)``, ``lo`` up;
- per host one ``sshd -D`` (own ed25519 host key, key-only root login, port 22 and an extra
  port), run in its own UTS and mount namespace so that its hostname is ``nodeK``, its
  ``/etc/hosts`` maps every ``nodeK`` to its address, and its agent cache folder
  (``remote_cache``) is private to it: the namespaces share this machine's filesystem, so
  without that every "host" would see the others' agent copies;
- a throwaway client key, a known_hosts with every host key, and an ssh_config with ``nodeK``
  and ``nodeK-alt`` (extra port) aliases. The real ``~/.ssh`` is never read or written.

``SshHosts.close()`` kills only what it started (each sshd by PID, then what ``ip netns pids``
lists in its own namespaces), deletes the namespaces and the bridge, and removes its folder.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "ssh-keygen", "mount", "hostname")
LOCK = "/tmp/rankdeck-testnet.lock"
ALT_PORT = 2222


def missing_requirements() -> str | None:
    """Why namespace hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces: run the e2e tests as root"
    if not os.access(SSHD, os.X_OK):
        return "needs OpenSSH's sshd at %s (apt-get install openssh-server)" % SSHD
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return "needs %s on PATH for network namespaces" % ", ".join(missing)
    return None


def _run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


@dataclass
class NodeHost:
    """One namespace host: ``name`` is its hostname and ssh_config alias."""

    name: str
    addr: str
    ns: str
    veth: str
    dir: str
    cache_dir: str  # this host's private agent cache, as seen from the root namespace
    host_key_pub: str
    sshd: subprocess.Popen | None = None


@dataclass
class SshHosts:
    hosts: list[NodeHost]
    base: str
    bridge: str
    subnet: str  # "10.77.X"
    client_key: str
    known_hosts: str
    ssh_config: str
    authorized_keys: str
    hosts_file: str
    remote_cache: str  # the cache path to give SshTransport(remote_cache=...)
    alt_port: int = ALT_PORT
    _closed: bool = field(default=False, repr=False)

    def __getitem__(self, name: str) -> NodeHost:
        for h in self.hosts:
            if h.name == name or h.ns == name:
                return h
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def inventory(self, python: str | None = None, alias_suffix: str = ""):
        """inventory Host objects for every namespace host (ssh = the ssh_config alias)."""
        from inventory.model import Host

        return [Host(name=h.name, addr=h.addr, ssh=h.name + alias_suffix,
                     python=python or sys.executable) for h in self.hosts]

    def unused_addr(self) -> str:
        """An address in the bridge's subnet that no host has."""
        return "%s.250" % self.subnet

    # -- helpers for tests -----------------------------------------------------------------
    def run_in(self, ns: str, argv, **kw) -> subprocess.CompletedProcess:
        """Run argv inside a host's network namespace (by namespace or host name)."""
        return subprocess.run(["ip", "netns", "exec", self[ns].ns, *argv],
                              capture_output=True, text=True, **kw)

    def link_down(self, name: str) -> None:
        _run(["ip", "-n", self[name].ns, "link", "set", "eth0", "down"])

    def link_up(self, name: str) -> None:
        _run(["ip", "-n", self[name].ns, "link", "set", "eth0", "up"])

    def stop_sshd(self, name: str) -> None:
        """Kill the host's sshd listener (sessions already open live on)."""
        h = self[name]
        if h.sshd is not None:
            _stop(h.sshd)
            h.sshd = None

    def start_sshd(self, name: str) -> None:
        h = self[name]
        if h.sshd is None:
            h.sshd = self._launch(h)
            _wait_ports([(h.addr, 22), (h.addr, self.alt_port)], [h.sshd])

    def _launch(self, h: NodeHost) -> subprocess.Popen:
        conf = os.path.join(h.dir, "sshd_config")
        log = os.path.join(h.dir, "sshd.log")
        # Each host a clean login: this machine's own shell startup files are masked (they
        # are shared by every "host" here; pyenv's init, for one, takes a lock in the home).
        masks = "".join("mount --bind /dev/null %s && " % shlex.quote(f) for f in _rc_files())
        script = ("mount --bind {hosts} /etc/hosts && mount --bind {cache} {mnt} && {masks}"
                  "hostname {name} && exec {sshd} -D -f {conf} -E {log}").format(
            hosts=self.hosts_file, cache=h.cache_dir, mnt=self.remote_cache, masks=masks,
            name=h.name, sshd=SSHD, conf=conf, log=log)
        # ip netns exec, unshare and sh all exec: the Popen's pid is sshd's.
        with open(log + ".err", "wb") as err:
            return subprocess.Popen(["ip", "netns", "exec", h.ns, "unshare", "--uts",
                                     "--mount", "sh", "-c", script], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err)

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for h in self.hosts:
            if h.sshd is not None:
                _stop(h.sshd)
                h.sshd = None
        for h in self.hosts:
            pids = subprocess.run(["ip", "netns", "pids", h.ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def _rc_files() -> list[str]:
    """Shell startup files of the login user (root) that sshd sessions would run."""
    home = pwd.getpwuid(0).pw_dir
    names = (".bashrc", ".profile", ".bash_profile", ".bash_login", ".zshenv", ".zshrc")
    return [os.path.join(home, n) for n in names if os.path.isfile(os.path.join(home, n))]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ports(addrs, procs, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(addrs)
    while pending:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError("sshd exited with %s (see its log)" % p.returncode)
        addr = pending[0]
        try:
            socket.create_connection(addr, timeout=0.5).close()
            pending.pop(0)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("sshd not listening on %s:%d after %g s" % (*addr, timeout))
            time.sleep(0.02)


def _free_subnet() -> int:
    """A third octet X with no 10.77.X.* address or route on this machine (call under LOCK)."""
    used = _run(["ip", "-o", "-4", "addr", "show"]).stdout + _run(["ip", "-4", "route"]).stdout
    choices = [x for x in range(1, 255) if ("10.77.%d." % x) not in used]
    if not choices:
        raise RuntimeError("no free 10.77.X.0/24 subnet")
    return random.choice(choices)


def _keygen(path: str, comment: str) -> subprocess.Popen:
    return subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                             "-f", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


SSHD_CONFIG = """\
ListenAddress {addr}:22
ListenAddress {addr}:{alt}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {authorized}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
MaxStartups 100:30:200
MaxSessions 50
PrintMotd no
X11Forwarding no
LogLevel VERBOSE
"""


def create_hosts(count: int = 4, alt_port: int = ALT_PORT) -> SshHosts:
    """Build ``count`` namespace hosts (see the module docstring). Call ``close()`` after."""
    reason = missing_requirements()
    if reason:
        raise RuntimeError(reason)
    if count > 200:
        raise ValueError("at most 200 hosts fit the /24")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    sid = "%04x" % random.getrandbits(16)
    while os.path.exists("/run/netns/rdk%s-node0" % sid):
        sid = "%04x" % random.getrandbits(16)
    base = tempfile.mkdtemp(prefix="rdk%s-" % sid)
    os.chmod(base, 0o755)
    client_key = os.path.join(base, "client_key")
    mount_point = os.path.join(base, "agent-cache")
    os.mkdir(mount_point)
    keygens = [_keygen(client_key, "rankdeck-test-client")]
    hosts: list[NodeHost] = []
    for k in range(count):
        d = os.path.join(base, "node%d" % k)
        os.makedirs(os.path.join(d, "cache"))
        hosts.append(NodeHost(name="node%d" % k, addr="", ns="rdk%s-node%d" % (sid, k),
                              veth="rdk%sv%d" % (sid, k), dir=d,
                              cache_dir=os.path.join(d, "cache"), host_key_pub=""))
        keygens.append(_keygen(os.path.join(d, "ssh_host_ed25519_key"), "node%d" % k))
    for p in keygens:
        if p.wait() != 0:
            raise RuntimeError("ssh-keygen failed: %s" % p.stderr.read().decode())
    env = SshHosts(hosts=hosts, base=base, bridge="rdk%sbr" % sid, subnet="",
                   client_key=client_key, known_hosts=os.path.join(base, "known_hosts"),
                   ssh_config=os.path.join(base, "ssh_config"),
                   authorized_keys=os.path.join(base, "authorized_keys"),
                   hosts_file=os.path.join(base, "hosts"), remote_cache=mount_point,
                   alt_port=alt_port)
    try:
        _build(env, alt_port)
    except BaseException:
        env.close()
        raise
    return env


def _build(env: SshHosts, alt_port: int) -> None:
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        x = _free_subnet()
        env.subnet = "10.77.%d" % x
        _run(["ip", "link", "add", env.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", env.subnet + ".1/24", "dev", env.bridge])
        _run(["ip", "link", "set", env.bridge, "up"])
    batch = []
    for k, h in enumerate(env.hosts):
        h.addr = "%s.%d" % (env.subnet, 11 + k)
        batch += ["netns add %s" % h.ns,
                  "link add %s type veth peer name eth0 netns %s" % (h.veth, h.ns),
                  "link set %s master %s up" % (h.veth, env.bridge)]
    _run(["ip", "-batch", "-"], input="\n".join(batch) + "\n")
    for h in env.hosts:
        _run(["ip", "-n", h.ns, "-batch", "-"],
             input="addr add %s/24 dev eth0\nlink set eth0 up\nlink set lo up\n" % h.addr)
    with open(env.client_key + ".pub") as f:
        client_pub = f.read()
    with open(env.authorized_keys, "w") as f:
        f.write(client_pub)
    with open(env.hosts_file, "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost\n")
        f.writelines("%s %s\n" % (h.addr, h.name) for h in env.hosts)
    known, config = [], ["# rankdeck test hosts (throwaway)\n"]
    for h in env.hosts:
        with open(os.path.join(h.dir, "ssh_host_ed25519_key.pub")) as f:
            h.host_key_pub = " ".join(f.read().split()[:2])
        known.append("%s,%s,[%s]:%d %s\n" % (h.name, h.addr, h.addr, alt_port, h.host_key_pub))
        config.append("Host %s\n  HostName %s\nHost %s-alt\n  HostName %s\n  Port %d\n"
                      % (h.name, h.addr, h.name, h.addr, alt_port))
        with open(os.path.join(h.dir, "sshd_config"), "w") as f:
            f.write(SSHD_CONFIG.format(addr=h.addr, alt=alt_port, dir=h.dir,
                                       authorized=env.authorized_keys))
    config.append("Host *\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n"
                  "  UserKnownHostsFile %s\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
                  "  LogLevel ERROR\n" % (env.client_key, env.known_hosts))
    with open(env.known_hosts, "w") as f:
        f.writelines(known)
    with open(env.ssh_config, "w") as f:
        f.writelines(config)
    for h in env.hosts:
        h.sshd = env._launch(h)
    _wait_ports([(h.addr, p) for h in env.hosts for p in (22, alt_port)],
                [h.sshd for h in env.hosts])


if __name__ == "__main__":  # manual poking: python tests/e2e/sshhosts.py 4
    hosts = create_hosts(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
    try:
        print("ssh -F %s node0    (Ctrl-C to tear down)" % hosts.ssh_config)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        hosts.close()
