"""Issue 11, the host side, on real sshd hosts (root only): the agent cache is checked before
anything in it runs, a run's files are the user's alone, and the rendezvous store listens on
the rendezvous address only and goes away once a run with no console attached has ended.

What a test plants on a host it plants as the host's user (or as root, for what another
user would own); each test puts the host's agent cache back as the fixture made it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from agent.host import procs
from agent.wire.version import agent_version
from console.transport.base import HostUnreachable
from console.transport.ssh import SshTransport

pytestmark = [pytest.mark.e2e, pytest.mark.root]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY  # noqa: E402
from tests.cli import rankdeck  # noqa: E402
from tests.waits import wait_for_sync  # noqa: E402

NOBODY = 65534
PWNED = "~/pwned"  # what the planted agent leaves behind when it runs
# A planted "agent": writes PWNED, then says hello with the expected version, so the console
# would take it for the real one.
FAKE_MAIN = r'''
import json, os, sys
open(os.path.expanduser("~/pwned"), "w").write("ran")
sys.stdout.write(json.dumps({"t": "hello", "proto": 1, "agent": %r, "host": "fake",
                             "python": "3", "pid": os.getpid()}) + "\n")
sys.stdout.flush()
sys.stdin.read()
'''


def transport(ssh_hosts) -> SshTransport:
    return SshTransport(ssh_config=ssh_hosts.ssh_config, known_hosts=ssh_hosts.known_hosts,
                        client_keys=[ssh_hosts.client_key], remote_cache=ssh_hosts.remote_cache,
                        connect_timeout=5)


def plant_fake_agent(ssh_hosts, name, cache):
    """A fake agent in ``cache`` (on host ``name``, as its user) under this version's name."""
    folder = "%s/agent-%s" % (cache, agent_version())
    ssh_hosts.put_text(name, folder + "/agent/__init__.py", "")
    ssh_hosts.put_text(name, folder + "/agent/__main__.py", FAKE_MAIN % agent_version())
    ssh_hosts.put_text(name, folder + "/.complete", "")
    return folder


def reset_cache(ssh_hosts, name):
    """The host's agent cache as the fixture made it: an empty folder of the user's."""
    cache = ssh_hosts.expand(ssh_hosts.remote_cache)
    ssh_hosts.sh(name, "rm -rf %s /tmp/shared-cache %s; mkdir -p %s; chown %s: %s"
                 % (cache, ssh_hosts.expand(PWNED), cache, ssh_hosts.user, cache), user=False)


@pytest.fixture
def node1(ssh_hosts):
    reset_cache(ssh_hosts, "node1")
    yield "node1"
    reset_cache(ssh_hosts, "node1")


async def open_agent(ssh_hosts, name):
    t = transport(ssh_hosts)
    try:
        stream = await t.open(ssh_hosts.inventory()[ssh_hosts.names.index(name)])
        hello = json.loads(await stream.readline())
        await stream.close()
        return stream, hello
    finally:
        await t.close()


@pytest.mark.parametrize("where", ["own-cache", "foreign-version-folder"])
async def test_planted_agent_is_replaced_not_run(ssh_hosts, node1, where):
    cache = ssh_hosts.remote_cache
    folder = plant_fake_agent(ssh_hosts, node1, cache)
    if where == "foreign-version-folder":  # another owner's folder inside the user's cache
        ssh_hosts.sh(node1, "chown -R %d:%d %s" % (NOBODY, NOBODY, ssh_hosts.expand(folder)),
                     user=False)
    stream, hello = await open_agent(ssh_hosts, node1)
    assert stream.copied and hello["host"] == "node1" and hello["agent"] == agent_version()
    assert not os.path.exists(ssh_hosts.local_path(node1, PWNED)), "the planted agent ran"
    local = ssh_hosts.local_path(node1, folder)
    assert os.path.isfile(os.path.join(local, "agent", "serve", "server.py"))  # the real agent's
    assert os.stat(local).st_uid != NOBODY and os.stat(local).st_mode & 0o077 == 0


@pytest.mark.parametrize("how, said", [
    ("chown %d %%s" % NOBODY, "it is owned by uid %d, not by you" % NOBODY),
    ("chmod 0777 %s", "other users can write to it (mode 777)"),
    ("mv %s /tmp/shared-cache && ln -s /tmp/shared-cache %s", "it is a symbolic link"),
], ids=["other-owner", "world-writable", "symlink"])
async def test_unsafe_cache_is_refused_with_the_reason(ssh_hosts, node1, how, said):
    cache = ssh_hosts.expand(ssh_hosts.remote_cache)
    plant_fake_agent(ssh_hosts, node1, ssh_hosts.remote_cache)
    ssh_hosts.sh(node1, how.replace("%s", cache), user=False)
    with pytest.raises(HostUnreachable) as err:
        await open_agent(ssh_hosts, node1)
    msg = str(err.value)
    assert err.value.cause == "agent-failed", msg
    assert "refusing the agent cache %s: %s" % (cache, said) in msg
    assert not os.path.exists(ssh_hosts.local_path(node1, PWNED)), "the planted agent ran"


# -- a run with no console attached ------------------------------------------------------------

def inventory(path, ssh_hosts, workdir, names):
    lines = ["transport: ssh", "defaults:", "  python: %s" % ssh_hosts.python,
             "  workdir: %s" % workdir, "hosts:"]
    for name in names:
        lines += ["  - name: %s" % name, "    ssh: %s" % name,
                  "    addr: %s" % ssh_hosts[name].addr]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def listeners(ssh_hosts, name, port) -> list[str]:
    """Local addresses listening on TCP ``port`` on host ``name`` (``*`` for all)."""
    out = ssh_hosts.run_in(name, ["ss", "-Hltn", "sport = :%d" % port]).stdout
    return [line.split()[3].rsplit(":", 1)[0] for line in out.splitlines()]


def read_as_nobody(ssh_hosts, name, path) -> subprocess.CompletedProcess:
    return ssh_hosts.run_on(name, ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                                   "--clear-groups", "cat", path], user=False)


def node_states(ssh_hosts, root, names) -> dict:
    out = {}
    for name in names:
        try:
            with open(ssh_hosts.local_path(name, "%s/%s/state.json" % (root, name))) as f:
                out[name] = json.load(f).get("state")
        except (OSError, ValueError):
            out[name] = None
    return out


def test_detached_run_private_files_and_a_store_that_ends_with_it(ssh_hosts, tmp_path,
                                                                    clean_home, project):
    names = ["node0", "node1"]
    (clean_home / ".ssh").mkdir(exist_ok=True)
    (clean_home / ".ssh" / "config").write_text(open(ssh_hosts.ssh_config).read())
    # a workdir outside the (private) home, as on a shared scratch disk: only the run
    # folder's own modes keep other users out
    work = "/tmp/proj-h1-%s" % secrets.token_hex(3)
    inv = inventory(tmp_path / "hosts.yaml", ssh_hosts, work, names)
    launched = rankdeck("launch", "--no-tui", "--detach", "--skip-preflight", "--max-restarts",
                        "0", "-i", inv, "--sync", str(project), "trainer/train.py", "--", *TINY,
                        "--steps", "30")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    run_id = launched.stdout.split()[-1]  # --detach prints the run id
    root = "%s/.rankdeck/runs/%s" % (work, run_id)
    store = json.load(open(ssh_hosts.local_path("node0", root + "/store.json")))
    rdzv_addr = ssh_hosts["node0"].addr
    assert listeners(ssh_hosts, "node0", store["port"]) == [rdzv_addr]

    wait_for_sync(lambda: all(s in ("exited", "failed", "stopped", "lost")
                              for s in node_states(ssh_hosts, root, names).values()), 240,
                  lambda: "every node ended: %s" % node_states(ssh_hosts, root, names),
                  every=0.5)
    assert node_states(ssh_hosts, root, names) == {n: "exited" for n in names}

    for name in names:  # the run folder and everything rankdeck wrote there: the user's only
        local = ssh_hosts.local_path(name, root)
        for path in (local, os.path.join(local, name), os.path.join(local, name, "torchrun")):
            assert os.stat(path).st_mode & 0o077 == 0, (path, oct(os.stat(path).st_mode))
        for rel in ("state.json", "journal", "supervisor.log", "torchrun.log"):
            path = os.path.join(local, name, rel)
            assert os.stat(path).st_mode & 0o077 == 0, (path, oct(os.stat(path).st_mode))
        logs = [os.path.join(top, f)[len(ssh_hosts[name].root):]
                for top, _d, files in os.walk(os.path.join(local, name, "torchrun"))
                for f in files if f == "stdout.log"]
        assert logs
        for path in ["%s/%s/state.json" % (root, name), logs[0]]:
            denied = read_as_nobody(ssh_hosts, name, path)
            assert denied.returncode != 0 and b"Permission denied" in denied.stderr, path

    # the store waits a little (a restart) and then goes
    def store_alive():  # its pid is node0's (the host's own process table)
        here = ssh_hosts.pid_here("node0", store["pid"])
        return here is not None and procs.alive(here, store["starttime"])
    wait_for_sync(lambda: not store_alive() and not listeners(
        ssh_hosts, "node0", store["port"]), 120, "the store to end with the run", every=0.5)
    log = open(ssh_hosts.local_path("node0", root + "/store.log")).read()
    assert "the run has ended on every node: store stopped" in log
