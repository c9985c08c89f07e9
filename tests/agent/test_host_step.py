"""A Slurm job's rankdeck-host step (agent/slurm/host_step.py), as real processes: what ``serve``
asks it to start is its child (on a proctrack/cgroup site: in its step's cgroup), its spec
through stdin; it answers only its own user; it ends once it has had no child for a while;
without a host, spawn starts the process itself. The cgroup site end to end:
tests/slurm/test_cgroup_site.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from agent.slurm import host_step
from agent.host import procs
from tests.waits import wait_for_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READ_SPEC = "import sys; open(sys.argv[1], 'w').write(sys.stdin.read()); import time; time.sleep(60)"


@pytest.fixture
def host(tmp_path):
    job = "t" + uuid.uuid4().hex[:8]
    proc = subprocess.Popen([sys.executable, "-m", "agent", "host", job],
                            env=dict(os.environ, PYTHONPATH=REPO), cwd=str(tmp_path))
    wait_for_sync(lambda: host_step.up({host_step.JOB_ENV: job}), 30, "the host answering")
    yield job, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def parent_of(pid: int) -> int:
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_what_serve_asks_is_the_host_s_child_and_it_ends_once_idle(host, tmp_path):
    job, proc = host
    env = dict(os.environ, **{host_step.JOB_ENV: job})
    got = tmp_path / "spec"
    child = host_step.spawn([sys.executable, "-c", READ_SPEC, str(got)], b'{"token": "s3"}',
                            str(tmp_path / "out.log"), env, str(tmp_path))
    assert isinstance(child, host_step.Spawned) and parent_of(child.pid) == proc.pid
    wait_for_sync(lambda: got.exists() and got.read_text() == '{"token": "s3"}', 30,
                  "the spec through stdin")
    assert child.poll() is None
    child.kill()
    wait_for_sync(lambda: child.poll() is not None, 30, "the child gone")
    assert "unknown" in str(child.returncode)
    proc.wait(timeout=host_step.IDLE_S + 30)  # no child left: it ends by itself
    assert not host_step.up(env)


def test_without_a_host_spawn_starts_the_process_itself(tmp_path):
    env = dict(os.environ, **{host_step.JOB_ENV: "none" + uuid.uuid4().hex[:8]})
    child = host_step.spawn([sys.executable, "-c", "import sys; sys.exit(3)"], None, None,
                            env, str(tmp_path))
    assert isinstance(child, subprocess.Popen) and child.wait(timeout=30) == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to ask as another user")
def test_another_user_is_refused(host, tmp_path):
    job, proc = host
    # a raw connection (host_step.ask would not even ask another user's host): the host
    # answers at once, before reading any request
    asker = ("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect(%r)\n"
             "print(s.recv(4096).decode())\n" % host_step.address(job))
    res = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                          sys.executable, "-c", asker], capture_output=True, text=True,
                         cwd="/", timeout=60)
    assert "is not this step's user" in res.stdout, (res.stdout, res.stderr)
    assert procs.alive(proc.pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to listen as another user")
def test_a_name_another_user_took_is_told_nothing(tmp_path):
    """Abstract socket names are first come: a listener of another user under this user's
    host name gets no request (the spec's secrets), and spawn starts the process itself."""
    job = "t" + uuid.uuid4().hex[:8]
    got = tmp_path / "heard"
    squatter = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind(%r)\ns.listen(4)\n"
                "print('up', flush=True)\nc, _ = s.accept()\nc.settimeout(5)\n"
                "try:\n    data = c.recv(65536)\nexcept OSError:\n    data = b''\n"
                "sys.stderr.write(repr(data))\n" % host_step.address(job))
    proc = subprocess.Popen(["setpriv", "--reuid", "65534", "--regid", "65534",
                             "--clear-groups", sys.executable, "-c", squatter],
                            stdout=subprocess.PIPE, stderr=open(got, "w"), text=True, cwd="/")
    try:
        assert proc.stdout.readline().strip() == "up"
        env = dict(os.environ, **{host_step.JOB_ENV: job})
        assert not host_step.up(env)
        child = host_step.spawn([sys.executable, "-c", "import sys; sys.exit(4)"],
                                b'{"token": "s3cret"}', None, env, str(tmp_path))
        assert isinstance(child, subprocess.Popen) and child.wait(timeout=30) == 4
    finally:
        proc.kill()
        proc.wait()
    assert "s3cret" not in got.read_text()
