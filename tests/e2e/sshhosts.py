"""Real OpenSSH hosts that are not the laptop, for e2e tests and benchmarks (root only).

``create_hosts(n)`` builds, on this machine, ``n`` hosts that share none of the laptop's
files, home, login user, Python or process table - only its kernel:

- a Linux bridge ``rdk<id>br`` in the root namespace with ``10.77.X.1/24`` (X picked free, under
  a lock, so parallel sessions do not collide; ``<id>`` is random per session);
- per host a network namespace ``rdk<id>-nodeK``, a veth pair (``eth0`` inside, on the bridge
  outside) with ``10.77.X.(11+K)``, ``lo`` up;
- per host a *holder* (``unshare``) and its child, the host's *init*: PID 1 of the host's
  own PID namespace (a tiny Python loop, ``INIT``, that reaps the orphans detached processes
  leave, and ends on SIGTERM, which ends every process of the host), in the host's own UTS
  and mount namespace with a fresh ``/proc`` (the host's process table only): hostname
  ``nodeK``, an ``/etc/hosts`` naming every host, and private tmpfs mounts on ``/home``
  (with the login user's empty home), ``/tmp``, ``/dev/shm`` and ``/root``, and over the
  project checkout and the laptop's venv, so a test that passes only because host and laptop
  share a disk fails. The init keeps the host's files while its sshd is stopped and started
  again, as a real machine keeps its disk;
- per host one ``sshd -D`` entered into that host's namespaces, its PID namespace
  included (own ed25519 host key, key-only, ``AllowUsers rdkuser``, ``PermitRootLogin no``);
  its config, keys and the authorized_keys live in a per-session folder under ``/srv``
  (outside every private mount);
- a login user ``rdkuser`` (not root, not the laptop's user), made once per machine;
- the hosts' training Python: a venv from ``/usr/bin/python3`` at ``/opt/rankdeck-hostpy``
  with torch, numpy and py-spy, built once per machine (under a lock, about 30 s) and reused;
- a throwaway client key, a known_hosts with every host key, and an ssh_config with ``nodeK``
  and ``nodeK-alt`` (extra port) aliases and ``User rdkuser``. The real ``~/.ssh`` is never
  read or written.

A host's private files are reached with ``local_path`` (through ``/proc/<init>/root``, to
read) and ``run_on`` / ``put_tree`` / ``put_text`` (``nsenter`` into the host as its user, to
write: files the agent later replaces must be the user's).

Everything entered into a host (``NodeHost.enter``: sshd, ``run_on``, ``command_on``) goes
through ``nsenter -p``, which forks: the command runs as a child of nsenter, in the host's
process table, with ``--pdeathsig KILL`` (``TERM`` for daemons), so ending the Popen ends the
command (``NodeHost.started`` gives its pid). ``processes`` lists the host's PID namespace
(pids as this machine sees them); ``NodeHost.ns_pid`` maps one to the pid the host itself
sees (what ``ps`` on it shows, and what rankdeck reports).

``SshHosts.close()`` kills only what it started (each sshd by PID, then each host's init,
which ends every process of the host and takes the private mounts with them),
deletes the namespaces, the bridge and its ``/srv`` folder. The user and the ``/opt`` venv
are left for the next session to reuse.
"""

from __future__ import annotations

import fcntl
import glob
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
from dataclasses import dataclass, field

SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "nsenter", "setpriv", "ssh-keygen", "mount", "hostname", "useradd",
         "usermod", "tar")
LOCK = "/tmp/rankdeck-testnet.lock"
ALT_PORT = 2222
USER = "rdkuser"
SRV = "/srv/rankdeck-test"  # per-session folders: sshd config, keys, authorized_keys
HOST_PY_DIR = "/opt/rankdeck-hostpy"
HOST_PY_BASE = "/usr/bin/python3"  # Debian's: a venv from the pyenv python points into /root
HOST_PY_PACKAGES = ("torch==2.13.0", "numpy", "py-spy")
HOST_PY_LOCK = "/opt/rankdeck-hostpy.lock"
HOST_PY_STAMP = ".rankdeck-checked"  # in the venv, written once torch imported there
AGENT_CACHE = "~/.cache/rankdeck"  # the transport's default: each host has its own home
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:  # run as a script (see the end): the tests' poller is imported
    sys.path.insert(0, REPO)
from tests.waits import wait_for_sync  # noqa: E402
# A real Python 3.6, shown to the hosts (at <session>/py36) when this machine has one
OLD_PYTHON_PREFIX = "/root/.pyenv/versions/3.6.15"
INIT_PYTHON = "/usr/bin/python3"  # the machine's, not the laptop venv's (hidden on the hosts)
# PID 1 of a host: reaps every child (orphans are re-parented to it: a PID 1 that never
# waits leaves detached processes as zombies) and exits on SIGTERM or SIGINT, which ends
# the host's PID namespace. Signals are blocked and taken by sigwaitinfo: no wakeup is lost.
INIT = """import os, signal
wanted = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if signal.sigwaitinfo(wanted).si_signo != signal.SIGCHLD:
        break
"""


def missing_requirements() -> str | None:
    """Why namespace hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces: run the e2e tests as root"
    if not os.access(SSHD, os.X_OK):
        return "needs OpenSSH's sshd at %s (apt-get install openssh-server)" % SSHD
    if not os.access(HOST_PY_BASE, os.X_OK):
        return "needs %s to build the hosts' Python" % HOST_PY_BASE
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return "needs %s on PATH for namespace hosts" % ", ".join(missing)
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
    dir: str  # its sshd's config, keys and log (in the session's /srv folder)
    host_key_pub: str
    holder: subprocess.Popen | None = None  # unshare, parent of the host's init
    init_pid: int = 0  # the host's PID 1, as this machine sees it
    sshd: subprocess.Popen | None = None  # nsenter, whose child is the host's sshd
    sshd_pid: int = 0  # that sshd, as this machine sees it
    cache_dir: str = ""  # its agent cache (the transport's default place), seen from here

    @property
    def root(self) -> str:
        """This host's / as seen from this machine (its init's root)."""
        return "/proc/%d/root" % self.init_pid

    def enter(self, pdeathsig: str = "KILL", setpriv=()) -> list[str]:
        """The argv prefix that runs a command in this host: its mounts, hostname, network
        and process table. nsenter forks (a PID namespace applies to children): the command
        is nsenter's child and gets ``pdeathsig`` when nsenter ends, so killing the Popen
        ends it too. ``setpriv``: more setpriv options (a uid change there clears a death
        signal set before it, so it is one setpriv, which sets the signal last)."""
        return ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-n", "-p", "--",
                "setpriv", "--pdeathsig", pdeathsig, *setpriv, "--"]

    def started(self, proc: subprocess.Popen) -> int:
        """The pid (this machine's) of the command that ``proc``, a Popen of ``enter`` or
        ``command_on``, runs in this host: nsenter's child."""
        return _child_of(proc)

    def ns_pid(self, pid: int) -> int | None:
        """The pid that this host sees for ``pid`` of this machine (None: not the host's)."""
        try:
            with open("/proc/%d/status" % pid) as f:
                nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            return None
        return int(nspid[-1]) if len(nspid) > 1 and self.owns(pid) else None

    def owns(self, pid) -> bool:
        """Whether ``pid`` (of this machine) lives in this host's PID namespace."""
        try:
            return (os.readlink("/proc/%s/ns/pid" % pid)
                    == os.readlink("/proc/%d/ns/pid" % self.init_pid))
        except OSError:
            return False


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
    user: str = USER
    home: str = "/home/" + USER  # the login user's home on every host (each its own)
    python: str = HOST_PY_DIR + "/bin/python"  # the hosts' training interpreter
    remote_cache: str = AGENT_CACHE  # to give SshTransport(remote_cache=...)
    old_python: str | None = None  # a real Python 3.6 on every host, when there is one
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
                     python=python or self.python) for h in self.hosts]

    def unused_addr(self) -> str:
        """An address in the bridge's subnet that no host has."""
        return "%s.250" % self.subnet

    # -- a host's private files ------------------------------------------------------------
    def expand(self, path: str) -> str:
        """``~`` and ``~/x`` as the login user's home on the hosts."""
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        return path

    def local_path(self, name: str, path: str) -> str:
        """The path on this machine that reaches ``path`` in host ``name``'s own files."""
        return self[name].root + self.expand(path)

    def command_on(self, name: str, argv, user: bool = True) -> list[str]:
        """The command line that runs argv on host ``name`` (its files, hostname, network and
        process table) as its login user, or as root with ``user=False``; a clean environment,
        HOME the user's home (for a caller that streams its output: bench/slurm.py)."""
        h = self[name]
        if not user:
            return h.enter() + list(argv)
        pw = pwd.getpwnam(self.user)
        cmd = h.enter(setpriv=["--reuid", str(pw.pw_uid), "--regid", str(pw.pw_gid),
                               "--init-groups"])
        cmd += ["env", "-i", "HOME=" + self.home, "USER=" + self.user,
                "LOGNAME=" + self.user, "PATH=/usr/local/bin:/usr/bin:/bin"]
        return cmd + list(argv)

    def run_on(self, name: str, argv, user: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run argv on host ``name`` as :meth:`command_on` says; its result."""
        kw.setdefault("capture_output", True)
        return subprocess.run(self.command_on(name, argv, user), cwd="/", **kw)

    def sh(self, name: str, script: str, user: bool = True) -> str:
        """Run a shell script on host ``name`` as its user; its stdout (raises on failure)."""
        res = self.run_on(name, ["sh", "-c", script], user=user, text=True)
        if res.returncode != 0:
            raise RuntimeError("on %s: %s: exit %d: %s" % (name, script, res.returncode,
                                                            res.stderr.strip()))
        return res.stdout

    def put_tree(self, name: str, src: str, dest: str) -> None:
        """Copy the folder ``src`` of this machine to ``dest`` on host ``name``, as its user
        (``__pycache__`` left out)."""
        data = _run_bytes(["tar", "-C", src, "--exclude=__pycache__", "-cf", "-", "."])
        dest = self.expand(dest)
        res = self.run_on(name, ["sh", "-c", 'mkdir -p "$1" && tar -C "$1" -xf -', "put",
                                 dest], input=data)
        if res.returncode != 0:
            raise RuntimeError("copy to %s:%s failed: %s" % (name, dest, res.stderr.decode()))

    def put_text(self, name: str, dest: str, text: str, mode: int = 0o644) -> None:
        """Write ``text`` to the file ``dest`` on host ``name``, as its user."""
        dest = self.expand(dest)
        res = self.run_on(name, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && '
                                 'chmod "$2" "$1"', "put", dest, "%o" % mode],
                          input=text.encode())
        if res.returncode != 0:
            raise RuntimeError("write %s:%s failed: %s" % (name, dest, res.stderr.decode()))

    def mkdirs(self, path: str) -> str:
        """Make the folder ``path`` (``~`` allowed) on every host, as the user; its path."""
        path = self.expand(path)
        for name in self.names:
            self.sh(name, "mkdir -p %s" % shlex.quote(path))
        return path

    # -- helpers for tests -----------------------------------------------------------------
    def run_in(self, ns: str, argv, **kw) -> subprocess.CompletedProcess:
        """Run argv inside a host's network namespace (by namespace or host name)."""
        return subprocess.run(["ip", "netns", "exec", self[ns].ns, *argv],
                              capture_output=True, text=True, **kw)

    def processes(self, name: str) -> list[str]:
        """Host ``name``'s processes, as ``PID ARGS`` lines (pids as this machine sees them):
        those in its network and PID namespace (``ps -u USER`` here sees the user's processes
        of every test on this machine; an nsenter that entered the host is not the host's)."""
        h = self[name]
        pids = subprocess.run(["ip", "netns", "pids", h.ns], capture_output=True,
                              text=True).stdout.split()
        found = []
        for pid in pids:
            if not h.owns(pid):
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    args = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue  # it ended meanwhile
            found.append("%s %s" % (pid, args))
        return found

    def pid_here(self, name: str, pid: int) -> int | None:
        """This machine's pid of the process host ``name`` sees as ``pid`` (a pid the host
        reported: the agent's hello, a pid file), or None when the host has no such process
        (a zombie counts as none: the host's init reaps it)."""
        h = self[name]
        for line in self.processes(name):
            here = int(line.split(None, 1)[0])
            if h.ns_pid(here) == pid:
                return here
        return None

    def link_down(self, name: str) -> None:
        _run(["ip", "-n", self[name].ns, "link", "set", "eth0", "down"])

    def link_up(self, name: str) -> None:
        _run(["ip", "-n", self[name].ns, "link", "set", "eth0", "up"])

    def stop_sshd(self, name: str) -> None:
        """Kill the host's sshd listener (sessions already open live on; files stay)."""
        h = self[name]
        if h.sshd is not None:
            _stop(h.sshd, h.sshd_pid)
            h.sshd, h.sshd_pid = None, 0

    def start_sshd(self, name: str) -> None:
        h = self[name]
        if h.sshd is None:
            h.sshd = self._launch(h)
            h.sshd_pid = _child_of(h.sshd)
            _wait_ports([(h.addr, 22), (h.addr, self.alt_port)], [h.sshd])

    def _hold(self, h: NodeHost) -> subprocess.Popen:
        """Start the process that owns host ``h``'s own mounts and hostname."""
        pw = pwd.getpwnam(self.user)
        hide = []  # the project and the laptop's venv (not one inside the other)
        for p in sorted({REPO, sys.prefix}):
            if os.path.isdir(p) and p != "/" and not any(p.startswith(q + "/") for q in hide):
                hide.append(p)
        lines = ["set -e",
                 "mount --bind %s /etc/hosts" % shlex.quote(self.hosts_file)]
        if self.old_python:  # before /root is hidden
            lines.append("mount --bind %s %s/py36" % (OLD_PYTHON_PREFIX, self.base))
        lines += [
            "mount -t tmpfs -o mode=755 tmpfs /home",
            "mkdir -m 700 {home}",
            "mkdir -p {home}/{cache}",
            "chown -R {uid}:{gid} {home}",
            "mount -t tmpfs -o mode=1777 tmpfs /tmp",
            "mount -t tmpfs -o mode=1777 tmpfs /dev/shm",
            "mount -t tmpfs -o mode=700 tmpfs /root"]
        lines = [line.format(home=shlex.quote(self.home), cache=AGENT_CACHE[2:],
                             uid=pw.pw_uid, gid=pw.pw_gid) for line in lines]
        lines += ["mount -t tmpfs -o mode=755,size=1m tmpfs %s" % shlex.quote(p)
                  for p in hide if not p.startswith(("/root/", "/home/", "/tmp/"))]
        init = shlex.quote(os.path.join(self.base, "init.py"))
        lines += ["hostname %s" % h.name, "echo ready", "exec %s -I %s" % (INIT_PYTHON, init)]
        return subprocess.Popen(["ip", "netns", "exec", h.ns, "unshare", "--uts", "--mount",
                                 "--pid", "--fork", "--mount-proc", "--propagation", "private",
                                 "sh", "-c", "\n".join(lines)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd="/")

    def _launch(self, h: NodeHost) -> subprocess.Popen:
        conf = os.path.join(h.dir, "sshd_config")
        log = os.path.join(h.dir, "sshd.log")
        # nsenter forks into the PID namespace: the Popen is nsenter, sshd its child.
        with open(log + ".err", "wb") as err:
            return subprocess.Popen(h.enter("TERM") + [SSHD, "-D", "-f", conf, "-E", log],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, cwd="/")

    # -- teardown --------------------------------------------------------------------------
    def close(self) -> None:
        """Kill what this session started, delete its namespaces, bridge and /srv folder
        (the user and the /opt venv stay for reuse)."""
        if self._closed:
            return
        self._closed = True
        for h in self.hosts:
            if h.sshd is not None:
                _stop(h.sshd, h.sshd_pid)
                h.sshd, h.sshd_pid = None, 0
        for h in self.hosts:  # a PID namespace ends with its init: every process of the host
            if h.init_pid:
                _signal(h.init_pid, signal.SIGKILL)
        for h in self.hosts:  # unshare ends once its child, the init, has
            if h.holder is not None:
                try:
                    h.holder.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        for h in self.hosts:  # then what else entered its network namespace
            pids = subprocess.run(["ip", "netns", "pids", h.ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            if h.holder is not None:
                if h.holder.poll() is None:
                    h.holder.kill()
                h.holder.wait()
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def _run_bytes(argv) -> bytes:
    return subprocess.run(argv, check=True, capture_output=True).stdout


def _child_of(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """The pid of ``proc``'s (nsenter's, unshare's) child, once it has forked it."""
    def child():
        if proc.poll() is not None:
            raise RuntimeError("%s exited with %s" % (proc.args[0], proc.returncode))
        try:
            with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
                kids = f.read().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None
    return wait_for_sync(child, timeout, "%s's child" % proc.args[0], every=0.01)


def _stop(proc: subprocess.Popen, child: int = 0) -> None:
    """End ``proc`` (an nsenter) by ending ``child``, the process it entered into a host."""
    if proc.poll() is None:
        _signal(child or proc.pid, signal.SIGTERM)
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            _signal(child or proc.pid, signal.SIGKILL)
            proc.kill()
            proc.wait()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_ports(addrs, procs, timeout: float = 15.0) -> None:
    def listening(addr) -> bool:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError("sshd exited with %s (see its log)" % p.returncode)
        try:
            socket.create_connection(addr, timeout=0.5).close()
        except OSError:
            return False
        return True
    for addr in addrs:
        wait_for_sync(lambda: listening(addr), timeout, "sshd listening on %s:%d" % addr,
                      every=0.02)


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


def ensure_user(name: str = USER) -> pwd.struct_passwd:
    """The hosts' login user, made once per machine (call under LOCK).

    ``useradd`` leaves the password locked (``!``), which OpenSSH with ``UsePAM no`` refuses
    even with a valid key ("Permission denied (publickey)"): ``*`` means no password but
    not locked. No home is made here: each host mounts its own.
    """
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        _run(["useradd", "--no-create-home", "--home-dir", "/home/" + name,
              "--shell", "/bin/bash", "--user-group", name])
        pw = pwd.getpwnam(name)
    _run(["usermod", "-p", "*", name])
    return pw


def _host_python_works(prefix: str) -> bool:
    probe = ("import numpy, torch, torch.distributed.run; "
             "assert torch.__version__.split('+')[0] == %r"
             % HOST_PY_PACKAGES[0].split("==")[1])
    py = os.path.join(prefix, "bin", "python")
    if not (os.access(py, os.X_OK) and os.access(os.path.join(prefix, "bin", "py-spy"),
                                                 os.X_OK)):
        return False
    return subprocess.run([py, "-c", probe], capture_output=True).returncode == 0


def _stamped(prefix: str) -> bool:
    """Whether ``prefix`` holds a venv that passed :func:`_host_python_works` for these
    packages (its stamp, written last) and still has them: the interpreter, py-spy and
    torch's dist-info of the pinned version. Checked in place of importing torch (3 CPU-s,
    several times a session: each ``create_hosts``)."""
    try:
        with open(os.path.join(prefix, HOST_PY_STAMP)) as f:
            if f.read() != _stamp_text():
                return False
    except OSError:
        return False
    torch_version = HOST_PY_PACKAGES[0].split("==")[1]
    return (os.access(os.path.join(prefix, "bin", "python"), os.X_OK)
            and os.access(os.path.join(prefix, "bin", "py-spy"), os.X_OK)
            and any(name.startswith(("torch-%s.dist-info" % torch_version,
                                     "torch-%s+" % torch_version))
                    for site in glob.glob(os.path.join(prefix, "lib", "python3*",
                                                       "site-packages"))
                    for name in os.listdir(site)))


def _stamp_text() -> str:
    return " ".join(HOST_PY_PACKAGES) + "\n"


def _stamp(prefix: str) -> None:
    with open(os.path.join(prefix, HOST_PY_STAMP), "w") as f:
        f.write(_stamp_text())


def ensure_host_python(prefix: str = HOST_PY_DIR) -> str:
    """The hosts' training Python (torch, numpy, py-spy), built once per machine and reused.

    Built in place under a lock from ``/usr/bin/python3`` (about 30 s from the local wheel
    cache); a half-built one (a build that was killed) fails the check and is built again.
    A venv that passed the check (torch imported) is stamped, and a stamped one is taken
    without importing torch again.
    """
    python = os.path.join(prefix, "bin", "python")
    with open(HOST_PY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stamped(prefix):
            return python
        if _host_python_works(prefix):
            _stamp(prefix)
            return python
        shutil.rmtree(prefix, ignore_errors=True)
        _run([HOST_PY_BASE, "-m", "venv", prefix])
        res = subprocess.run([python, "-m", "pip", "install", "-q", *HOST_PY_PACKAGES],
                             capture_output=True, text=True)
        if res.returncode != 0 or not _host_python_works(prefix):
            raise RuntimeError("cannot build the hosts' Python at %s: %s"
                               % (prefix, (res.stderr or res.stdout)[-2000:]))
        _stamp(prefix)
    return python


SSHD_CONFIG = """\
ListenAddress {addr}:22
ListenAddress {addr}:{alt}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {authorized}
AllowUsers {user}
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
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
    python = ensure_host_python()
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    os.makedirs(SRV, mode=0o755, exist_ok=True)
    sid = "%04x" % random.getrandbits(16)
    while os.path.exists("/run/netns/rdk%s-node0" % sid):
        sid = "%04x" % random.getrandbits(16)
    base = tempfile.mkdtemp(prefix="rdk%s-" % sid, dir=SRV)
    os.chmod(base, 0o755)  # sshd reads authorized_keys as the user
    client_key = os.path.join(base, "client_key")
    keygens = [_keygen(client_key, "rankdeck-test-client")]
    hosts: list[NodeHost] = []
    for k in range(count):
        d = os.path.join(base, "node%d" % k)
        os.makedirs(d)
        hosts.append(NodeHost(name="node%d" % k, addr="", ns="rdk%s-node%d" % (sid, k),
                              veth="rdk%sv%d" % (sid, k), dir=d, host_key_pub=""))
        keygens.append(_keygen(os.path.join(d, "ssh_host_ed25519_key"), "node%d" % k))
    for p in keygens:
        if p.wait() != 0:
            raise RuntimeError("ssh-keygen failed: %s" % p.stderr.read().decode())
    env = SshHosts(hosts=hosts, base=base, bridge="rdk%sbr" % sid, subnet="",
                   client_key=client_key, known_hosts=os.path.join(base, "known_hosts"),
                   ssh_config=os.path.join(base, "ssh_config"),
                   authorized_keys=os.path.join(base, "authorized_keys"),
                   hosts_file=os.path.join(base, "hosts"), python=python, alt_port=alt_port)
    try:
        _build(env, alt_port)
    except BaseException:
        env.close()
        raise
    return env


def _build(env: SshHosts, alt_port: int) -> None:
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pw = ensure_user(env.user)
        x = _free_subnet()
        env.subnet = "10.77.%d" % x
        _run(["ip", "link", "add", env.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", env.subnet + ".1/24", "dev", env.bridge])
        _run(["ip", "link", "set", env.bridge, "up"])
    env.home = pw.pw_dir
    if os.access(os.path.join(OLD_PYTHON_PREFIX, "bin", "python3.6"), os.X_OK):
        os.mkdir(os.path.join(env.base, "py36"))  # the mount point, filled in each host
        env.old_python = os.path.join(env.base, "python3.6")
        with open(env.old_python, "w") as f:  # its libpython is found through its old prefix
            f.write('#!/bin/sh\nLD_LIBRARY_PATH={d}/lib exec {d}/bin/python3.6 "$@"\n'.format(
                d=os.path.join(env.base, "py36")))
        os.chmod(env.old_python, 0o755)
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
    os.chmod(env.authorized_keys, 0o644)
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
            f.write(SSHD_CONFIG.format(addr=h.addr, alt=alt_port, dir=h.dir, user=env.user,
                                       authorized=env.authorized_keys))
    config.append("Host *\n  User %s\n  IdentityFile %s\n  IdentitiesOnly yes\n"
                  "  UserKnownHostsFile %s\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
                  "  LogLevel ERROR\n" % (env.user, env.client_key, env.known_hosts))
    with open(os.path.join(env.base, "init.py"), "w") as f:  # each host's PID 1
        f.write(INIT)
    with open(env.known_hosts, "w") as f:
        f.writelines(known)
    with open(env.ssh_config, "w") as f:
        f.writelines(config)
    for h in env.hosts:
        h.holder = env._hold(h)
    for h in env.hosts:
        line = h.holder.stdout.readline()
        h.holder.stdout.close()
        if line.strip() != b"ready":
            h.holder.wait()
            raise RuntimeError("host %s did not come up: %s"
                               % (h.name, h.holder.stderr.read().decode().strip()))
        h.holder.stderr.close()
        h.init_pid = _child_of(h.holder)
        h.cache_dir = env.local_path(h.name, env.remote_cache)
    for h in env.hosts:
        h.sshd = env._launch(h)
    for h in env.hosts:
        h.sshd_pid = _child_of(h.sshd)
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
