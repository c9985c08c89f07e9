"""The SSH transport against real OpenSSH hosts that are not the laptop (root only).

Each test builds its own SshTransport with the fixture's ssh_config / known_hosts / client key;
the agent cache is the transport's default (``~/.cache/rankdeck``) in each host's own home, so
nothing touches the real ~/.ssh or home. What a test puts on a host it puts as the host's user.
"""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys

import asyncssh
import pytest

from agent.wire import protocol
from agent.wire.version import HERE as AGENT_ROOT, agent_version, source_files
from console.transport.base import HostUnreachable
from console.transport.ssh import SshTransport, open_all
from inventory.model import Host
from sshhosts import REPO
from tests.waits import wait_for, wait_for_sync

pytestmark = [pytest.mark.e2e, pytest.mark.root]

FAKE_PY36 = r'''
import runpy, sys
sys.version_info = (3, 6, 15, "final", 0)  # everything below sees an old interpreter
args = sys.argv[1:]
while args and args[0] in ("-E", "-S"):
    args.pop(0)
if args[0] == "-c":
    sys.argv = ["-c"] + args[2:]
    exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
else:  # -m MODULE ARGS
    sys.argv = [args[1]] + args[2:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
'''


@pytest.fixture
async def transports(ssh_hosts):
    """Factory for transports on the fixture hosts; all closed after the test."""
    made = []

    def make(**kw):
        kw.setdefault("ssh_config", ssh_hosts.ssh_config)
        kw.setdefault("known_hosts", ssh_hosts.known_hosts)
        kw.setdefault("client_keys", [ssh_hosts.client_key])
        kw.setdefault("remote_cache", ssh_hosts.remote_cache)
        kw.setdefault("connect_timeout", 5)
        t = SshTransport(**kw)
        made.append(t)
        return t

    yield make
    for t in made:
        await t.close()


def clear_caches(ssh_hosts):
    for h in ssh_hosts.hosts:
        for name in os.listdir(h.cache_dir):
            shutil.rmtree(os.path.join(h.cache_dir, name))


def py_files(folder: str) -> list[str]:
    """The agent's source files under ``folder``, sub-packages' too (``serve/server.py``)."""
    return source_files(folder)


def fingerprint_of(pub_line: str) -> str:
    return asyncssh.import_public_key(pub_line).get_fingerprint("sha256")


async def ping(stream) -> dict:
    stream.write(protocol.encode({"t": "req", "id": 7, "op": "ping", "args": {}}))
    await stream.drain()
    while True:  # the agent may push other messages (gpu) first
        msg = protocol.decode(await asyncio.wait_for(stream.readline(), 10))
        if msg["t"] == "res":
            return msg


def established_ssh(ssh_hosts, name: str) -> int:
    out = ssh_hosts.run_in(name, ["ss", "-Htn", "state", "established", "( sport = :22 )"]).stdout
    return len(out.splitlines())


def opens_seen(t) -> list[tuple[str, str]]:
    """``t.open`` made to note ("start" | "end", host) in the order they happen."""
    seen: list[tuple[str, str]] = []
    real = t.open

    async def open_(host):
        seen.append(("start", host.name))
        try:
            return await real(host)
        finally:
            seen.append(("end", host.name))
    t.open = open_
    return seen


async def test_open_four_hosts_in_parallel_copy_once(ssh_hosts, transports):
    clear_caches(ssh_hosts)
    version = agent_version()
    t = transports()
    seen = opens_seen(t)
    streams = await open_all(t, ssh_hosts.inventory())
    assert [kind for kind, _host in seen] == ["start"] * 4 + ["end"] * 4, seen  # at once
    assert all(not isinstance(s, HostUnreachable) for s in streams.values()), streams
    marks = {}
    for h in ssh_hosts.hosts:
        s = streams[h.name]
        hello = protocol.decode(await s.readline())  # the hello is handed on to the caller
        assert hello["t"] == "hello" and hello["proto"] == 1 and hello["agent"] == version
        assert hello["host"] == h.name  # the namespace host's own hostname
        assert (await ping(s))["ok"] is True
        assert s.copied
        folder = os.path.join(h.cache_dir, "agent-" + version)
        assert py_files(os.path.join(folder, "agent")) == py_files(AGENT_ROOT)
        assert "serve/server.py" in py_files(os.path.join(folder, "agent"))  # a sub-package's
        assert os.listdir(h.cache_dir) == ["agent-" + version]  # no temp folders left
        marks[h.name] = os.stat(os.path.join(folder, ".complete")).st_mtime_ns

    # A second stream and a command on node0 share its one SSH connection.
    extra = await t.open(ssh_hosts.inventory()[0])
    assert await t.run_command(ssh_hosts.inventory()[0], "true") == (0, "", "")
    assert established_ssh(ssh_hosts, "node0") == 1
    await extra.close()

    # Warm: a new transport (new connections) finds the agent and copies nothing.
    again = await open_all(transports(), ssh_hosts.inventory())
    for h in ssh_hosts.hosts:
        s = again[h.name]
        assert not isinstance(s, HostUnreachable), s
        assert not s.copied
        assert json.loads(await s.readline())["agent"] == version
        folder = os.path.join(h.cache_dir, "agent-" + version)
        assert os.stat(os.path.join(folder, ".complete")).st_mtime_ns == marks[h.name]


async def test_close_ends_serve(ssh_hosts, transports):
    s = await transports().open(ssh_hosts.inventory()[1])
    pid = json.loads(await s.readline())["pid"]  # as the host sees it (its own process table)
    assert ssh_hosts.pid_here(ssh_hosts.names[1], pid)
    await s.close()
    await wait_for(lambda: ssh_hosts.pid_here(ssh_hosts.names[1], pid) is None, 30,
                   "serve to end with its closed channel", every=0.05)


async def test_an_open_cancelled_before_the_hello_leaves_nothing_running(ssh_hosts, transports):
    """A caller's timeout (open_all's, or close() during a reconnect) cancels open() while it
    waits for the hello: the channel is closed, so what it started on the host ends."""
    node = ssh_hosts.names[2]
    mute = ssh_hosts.expand("~/mutepy/python3")  # starts, never says hello, ends at stdin EOF
    ssh_hosts.put_text(node, mute, "#!/bin/sh\necho $$ > $HOME/mutepy/pid\n"
                                   "exec cat > /dev/null\n", mode=0o755)
    pid_file = ssh_hosts.local_path(node, "~/mutepy/pid")
    if os.path.exists(pid_file):
        os.unlink(pid_file)
    t = transports()  # kept open past the cancel: its connection to the host stays up
    opening = asyncio.ensure_future(t.open(ssh_hosts.inventory(python=mute)[2]))
    await wait_for(lambda: os.path.exists(pid_file) and open(pid_file).read().strip(), 30,
                   "the mute interpreter to run on the host", every=0.05)
    pid = int(open(pid_file).read())  # as the host sees it
    assert ssh_hosts.pid_here(node, pid)
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    await wait_for(lambda: ssh_hosts.pid_here(node, pid) is None, 30,
                   "the cancelled start to end with its open()", every=0.05)


async def test_half_copied_folder_is_redone(ssh_hosts, transports):
    h = ssh_hosts.hosts[2]
    clear_caches(ssh_hosts)
    folder = "%s/agent-%s" % (ssh_hosts.remote_cache, agent_version())
    ssh_hosts.put_text(h.name, folder + "/agent/serve/server.py",
                       "raise SystemExit('half a file')")  # no .complete marker
    s = await transports().open(ssh_hosts.inventory()[2])
    assert s.copied and json.loads(await s.readline())["t"] == "hello"


async def test_tampered_copy_is_copied_afresh(ssh_hosts, transports):
    # the bootstrap hashes the cached copy before it runs it (more: test_ssh_host_hardening.py)
    h = ssh_hosts.hosts[3]
    clear_caches(ssh_hosts)
    version = agent_version()
    on_host = "%s/agent-%s" % (ssh_hosts.remote_cache, version)
    ssh_hosts.put_tree(h.name, AGENT_ROOT, on_host + "/agent")
    ssh_hosts.sh(h.name, "cd %s && echo '# edited on the host' >> agent/wire/version.py && "
                 "touch .complete" % ssh_hosts.expand(on_host))
    folder = os.path.join(h.cache_dir, "agent-" + version)
    s = await transports().open(ssh_hosts.inventory()[3])
    assert s.copied and json.loads(await s.readline())["agent"] == version
    with open(os.path.join(folder, "agent", "wire", "version.py")) as f:
        assert "edited on the host" not in f.read()


async def test_unknown_host_key_refused_then_recorded_with_flag(ssh_hosts, transports, tmp_path):
    node1 = ssh_hosts.hosts[1]
    known = tmp_path / "known_hosts"
    known.write_text("".join("%s %s\n" % (h.addr, h.host_key_pub)
                             for h in ssh_hosts.hosts if h.name != "node1"))
    host = ssh_hosts.inventory()[1]
    with pytest.raises(HostUnreachable) as err:
        await transports(known_hosts=str(known)).open(host)
    msg = str(err.value)
    assert err.value.cause == "hostkey"
    assert msg.startswith("node1 (%s)" % node1.addr)
    assert "not known" in msg and "--accept-new-host-keys" in msg
    assert "ssh-ed25519 " + fingerprint_of(node1.host_key_pub) in msg
    assert node1.host_key_pub.split()[1] not in known.read_text()

    s = await transports(known_hosts=str(known), accept_new_host_keys=True).open(host)
    assert json.loads(await s.readline())["t"] == "hello"
    assert "%s %s\n" % (node1.addr, node1.host_key_pub) in known.read_text()

    s = await transports(known_hosts=str(known)).open(host)  # now known, no flag needed
    assert json.loads(await s.readline())["t"] == "hello"


async def test_changed_host_key_refused_even_with_flag(ssh_hosts, transports, tmp_path):
    node1, node2 = ssh_hosts.hosts[1], ssh_hosts.hosts[2]
    known = tmp_path / "known_hosts"
    known.write_text("# header\n%s %s\n%s %s\n" % (node2.addr, node2.host_key_pub,
                                                 node1.addr, node2.host_key_pub))
    before = known.read_text()
    with pytest.raises(HostUnreachable) as err:
        await transports(known_hosts=str(known), accept_new_host_keys=True).open(
            ssh_hosts.inventory()[1])
    msg = str(err.value)
    assert err.value.cause == "hostkey"
    assert "CHANGED" in msg and fingerprint_of(node1.host_key_pub) in msg
    assert "%s:3" % known in msg  # where the old key is
    assert known.read_text() == before


async def test_wrong_client_key_is_auth(ssh_hosts, transports, tmp_path):
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(tmp_path / "id_other"))
    with pytest.raises(HostUnreachable) as err:
        await transports(client_keys=[str(tmp_path / "id_other")]).open(ssh_hosts.inventory()[0])
    assert err.value.cause == "auth" and "permission denied" in str(err.value)


async def test_stopped_sshd_is_refused_others_open(ssh_hosts, transports):
    ssh_hosts.stop_sshd("node2")
    try:
        results = await open_all(transports(), ssh_hosts.inventory())
    finally:
        ssh_hosts.start_sshd("node2")
    assert isinstance(results["node2"], HostUnreachable)
    assert results["node2"].cause == "refused", results["node2"]
    assert str(results["node2"]).startswith("node2 (%s)" % ssh_hosts["node2"].addr)
    for name in ("node0", "node1", "node3"):
        assert not isinstance(results[name], HostUnreachable), results[name]


async def test_silent_address_times_out_without_blocking_others(ssh_hosts, transports):
    """A host that never answers (it takes the connection and says nothing, as a hung sshd)
    is given up at the connect timeout, and holds no other host back: node0, asked for after
    it, is open before it is given up. The timeout is far longer than node0 takes, even on a
    loaded machine, so the order is the transport's and not the machine's speed."""
    held = []  # the silent host's connections, kept open and unanswered
    silent = await asyncio.start_server(lambda _r, w: held.append(w), "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    ghost = Host(name="ghost", addr="127.0.0.1", ssh="127.0.0.1:%d" % port,
                 python=ssh_hosts.python)
    t = transports(connect_timeout=30)
    seen = opens_seen(t)
    try:
        results = await open_all(t, [ghost] + ssh_hosts.inventory()[:1])
    finally:
        silent.close()
        for w in held:
            w.close()
    assert results["ghost"].cause == "timeout", results["ghost"]
    assert not isinstance(results["node0"], HostUnreachable), results["node0"]
    assert seen == [("start", "ghost"), ("start", "node0"), ("end", "node0"),
                    ("end", "ghost")], seen


async def test_cut_link_times_out_and_comes_back(ssh_hosts, transports):
    host = ssh_hosts.inventory()[3]
    ssh_hosts.link_down("node3")
    try:
        with pytest.raises(HostUnreachable) as err:
            await transports(connect_timeout=1).open(host)
        assert err.value.cause in ("timeout", "unreachable"), err.value
    finally:
        ssh_hosts.link_up("node3")
    s = await transports().open(host)
    assert json.loads(await s.readline())["host"] == "node3"


async def test_unresolvable_name_is_dns(transports, ssh_hosts):
    host = Host(name="nowhere", addr="x", ssh="no-such-host.invalid", python=ssh_hosts.python)
    with pytest.raises(HostUnreachable) as err:
        await transports().open(host)
    assert err.value.cause == "dns" and str(err.value).startswith("nowhere")


async def test_missing_python_is_no_python(ssh_hosts, transports):
    host = ssh_hosts.inventory(python="/opt/no/such/python3")[0]
    with pytest.raises(HostUnreachable) as err:
        await transports().open(host)
    assert err.value.cause == "no-python"
    assert "/opt/no/such/python3" in str(err.value)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
async def test_old_python_is_too_old(ssh_hosts, transports, warm):
    node0 = ssh_hosts.names[0]
    fake = ssh_hosts.expand("~/fakepy36/python3.6")
    ssh_hosts.put_text(node0, "~/fakepy36/fakepy36.py", FAKE_PY36)
    ssh_hosts.put_text(node0, fake, "#!/bin/sh\nexec %s %s \"$@\"\n" % (
        ssh_hosts.python, ssh_hosts.expand("~/fakepy36/fakepy36.py")), mode=0o755)
    clear_caches(ssh_hosts)
    if warm:  # the agent is already there, copied by a good interpreter
        s = await transports().open(ssh_hosts.inventory()[0])
        await s.close()
    with pytest.raises(HostUnreachable) as err:
        await transports().open(ssh_hosts.inventory(python=str(fake))[0])
    assert err.value.cause == "python-too-old", err.value
    assert "Python 3.6" in str(err.value) and ">= 3.8" in str(err.value)


async def test_real_old_python_is_too_old(ssh_hosts, transports):
    if not ssh_hosts.old_python:
        pytest.skip("no real Python 3.6 on this machine to show the hosts")
    clear_caches(ssh_hosts)
    with pytest.raises(HostUnreachable) as err:
        await transports().open(ssh_hosts.inventory(python=ssh_hosts.old_python)[1])
    assert err.value.cause == "python-too-old" and "Python 3.6" in str(err.value)


async def test_ssh_config_alias_other_port_user_identity(ssh_hosts, transports):
    # Only the ssh_config: HostName, Port 2222, User, IdentityFile and UserKnownHostsFile all
    # come from it (HOME is a temp folder, so there are no default keys to fall back on).
    t = transports(known_hosts=None, client_keys=None)
    host = ssh_hosts.inventory(alias_suffix="-alt")[3]
    status, out, _ = await t.run_command(host, "echo $SSH_CONNECTION; id -un; hostname")
    conn, user, hostname = out.split("\n")[:3]
    assert status == 0
    assert conn.split()[2:] == [ssh_hosts["node3"].addr, str(ssh_hosts.alt_port)]
    assert (user, hostname) == (ssh_hosts.user, "node3")
    s = await t.open(host)
    assert json.loads(await s.readline())["host"] == "node3"


async def test_run_command_argv_and_status(ssh_hosts, transports):
    t = transports()
    result = await t.run_command(ssh_hosts.inventory()[0],
                                 ["sh", "-c", "echo 'it''s'; echo err >&2; exit 3"])
    assert result == (3, "its\n", "err\n")


def test_fixture_knows_each_sshd_pid(ssh_hosts):
    for h in ssh_hosts.hosts:
        assert h.sshd is not None and h.sshd.poll() is None
        assert h.sshd_pid in {int(p.split()[0]) for p in ssh_hosts.processes(h.name)}


def test_each_host_has_its_own_process_table_and_an_init_that_reaps(ssh_hosts):
    """ps on a host lists that host's processes only (a PID namespace each, sshhosts.py), and
    a detached process that ends is reaped there (no zombie left), as on a real machine."""
    ssh = ["ssh", "-F", ssh_hosts.ssh_config, "node1"]
    marker = "rdk-detached-%d" % os.getpid()
    out = subprocess.run(ssh + ["(exec -a %s sleep 60 </dev/null >/dev/null 2>&1 &) ; "
                                "ps -e -o pid=,stat=,args=" % marker],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    table = [line.split(None, 2) for line in out.stdout.strip().splitlines()]
    assert table[0][0] == "1" and "init.py" in table[0][2], table
    assert any(marker in args for _pid, _st, args in table), table
    assert not any("pytest" in args or "/node2/" in args
                   for _pid, _st, args in table), table  # not the laptop's, nor node2's
    detached = [p for p in ssh_hosts.processes("node1") if marker in p]
    assert len(detached) == 1 and not any(marker in p for p in ssh_hosts.processes("node2"))
    os.kill(int(detached[0].split()[0]), signal.SIGKILL)  # its parent is node1's init

    def reaped():
        ps = subprocess.run(ssh + ["ps -e -o stat=,comm="], capture_output=True, text=True,
                            timeout=60).stdout.splitlines()
        return not any(line.startswith("Z") and "sleep" in line for line in ps)
    wait_for_sync(reaped, 30, "node1's init to reap the detached sleep")


def test_hosts_are_not_the_laptop(ssh_hosts, tmp_path):
    """The fixture itself: another user, key-only, no root, its own home, /tmp and Python,
    and none of the project's files."""
    ssh = ["ssh", "-F", ssh_hosts.ssh_config]
    script = ("id -u; echo $HOME; hostname; ls -A {repo} | wc -l; "
              "test -e {laptop_py} && echo laptop-python || echo no-laptop-python; "
              "{py} -c 'import sys, torch; print(sys.prefix)'").format(
        repo=REPO, laptop_py=sys.executable, py=ssh_hosts.python)
    out = subprocess.run(ssh + ["node1", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    uid, home, hostname, repo_entries, laptop_py, prefix = out.stdout.split("\n")[:6]
    assert int(uid) not in (0, os.getuid()) and home == ssh_hosts.home
    assert hostname == "node1" and repo_entries == "0" and laptop_py == "no-laptop-python"
    assert prefix != sys.prefix and ssh_hosts.python != sys.executable
    root = subprocess.run(ssh + ["-l", "root", "node1", "true"], capture_output=True,
                          text=True, timeout=60)
    assert root.returncode == 255 and "Permission denied" in root.stderr
    # files are private to each host: its home and /tmp; the laptop's are not there
    (tmp_path / "mine").write_text("laptop")
    for path in ("~/only-on-node2", "/tmp/only-on-node2"):
        ssh_hosts.put_text("node2", path, "node2")
        assert open(ssh_hosts.local_path("node2", path)).read() == "node2"
        assert not os.path.exists(ssh_hosts.local_path("node1", path))
        assert not os.path.exists(ssh_hosts.expand(path))
    assert not os.path.exists(ssh_hosts.local_path("node2", str(tmp_path / "mine")))
    ssh_hosts.sh("node2", "rm ~/only-on-node2 /tmp/only-on-node2")


def jump_config(ssh_hosts, tmp_path, via="node0") -> str:
    """The fixture's ssh_config plus ``nodeK-via0`` aliases reached through ProxyJump node0."""
    extra = "".join("Host %s-via0\n  HostName %s\n  ProxyJump %s\n" % (h.name, h.addr, via)
                    for h in ssh_hosts.hosts[1:])
    path = tmp_path / "ssh_config"
    path.write_text(extra + open(ssh_hosts.ssh_config).read())
    return str(path)


async def test_proxyjump_hosts_share_one_jump_connection(ssh_hosts, transports, tmp_path):
    t = transports(ssh_config=jump_config(ssh_hosts, tmp_path))
    hosts = ssh_hosts.inventory(alias_suffix="-via0")[2:]
    streams = await open_all(t, hosts)
    for h in hosts:
        assert json.loads(await streams[h.name].readline())["host"] == h.name
        status, out, _ = await t.run_command(h, "echo $SSH_CONNECTION")
        assert out.split()[0] == ssh_hosts["node0"].addr  # the connection came from node0
    assert established_ssh(ssh_hosts, "node0") == 1  # one jump connection for both


async def test_proxyjump_failure_names_host_and_jump(ssh_hosts, transports, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("".join("%s %s\n" % (h.addr, h.host_key_pub) for h in ssh_hosts.hosts[1:]))
    t = transports(ssh_config=jump_config(ssh_hosts, tmp_path), known_hosts=str(known))
    with pytest.raises(HostUnreachable) as err:
        await t.open(ssh_hosts.inventory(alias_suffix="-via0")[2])
    msg = str(err.value)
    assert err.value.cause == "hostkey"
    assert msg.startswith("node2 (%s): jump host node0 (%s): host key not known"
                          % (ssh_hosts["node2"].addr, ssh_hosts["node0"].addr)), msg
    assert fingerprint_of(ssh_hosts["node0"].host_key_pub) in msg


def test_parse_target():
    from console.transport.ssh import parse_target

    assert parse_target("node1") == ("node1", None, None)
    assert parse_target("alice@gpu-3:2222") == ("gpu-3", 2222, "alice")
    assert parse_target("[fe80::1]:22") == ("fe80::1", 22, None)
    assert parse_target("bob@fe80::1") == ("fe80::1", None, "bob")


def test_ssh_transport_imports_no_textual():
    code = ("import sys, console.transport.ssh; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
