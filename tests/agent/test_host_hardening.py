"""Issue 11, the host side, on this machine: run ids, private files, the rendezvous store's
listening address, and a kill that reaches only the run's own processes.

The agent-cache checks and a whole detached run (the store ending with it, the files of a
real run) are in tests/e2e/test_ssh_host_hardening.py, on hosts that are not the laptop.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from agent.node import ops as node_ops
from agent.host import procs
from agent.wire import protocol
from agent.store.tcpstore import start_store, stop_store
from console.launch.spec import new_run_id
from tests.spine.helpers import HOST_PYTHON
from tests.waits import wait_for_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RDZV_ADDR = "127.0.0.2"  # loopback, but not the address a stranger's client would try first


def test_run_ids_launched_in_one_second_do_not_collide():
    ids = [new_run_id() for _ in range(3000)]
    assert len(set(ids)) == len(ids)


def listening(port):
    out = subprocess.run(["ss", "-Hltn", "sport = :%d" % port], capture_output=True,
                         text=True).stdout
    return [line.split()[3].rsplit(":", 1)[0] for line in out.splitlines()]


def agent_request(serve, req_id, op, **args):
    serve.stdin.write(protocol.encode({"t": "req", "id": req_id, "op": op, "args": args}))
    serve.stdin.flush()
    while True:
        msg = protocol.decode(serve.stdout.readline())
        if msg.get("t") == "res" and msg.get("id") == req_id:
            assert msg["ok"], msg
            return msg["data"]


def test_store_listens_on_the_rendezvous_address_only(tmp_path):
    run_root = str(tmp_path / "r1")
    store = start_store(run_root, RDZV_ADDR, HOST_PYTHON)
    try:
        assert listening(store["port"]) == [RDZV_ADDR]
        with pytest.raises(ConnectionRefusedError):  # any other address of the host
            socket.create_connection(("127.0.0.1", store["port"]), timeout=5).close()
        socket.create_connection((RDZV_ADDR, store["port"]), timeout=5).close()
    finally:
        stop_store(run_root)


def test_what_serve_writes_is_private(tmp_path):
    """serve (and what it starts) writes with umask 077, whatever the login's umask."""
    run_root = tmp_path / "runs" / "r1"
    serve = subprocess.Popen([sys.executable, "-m", "agent", "serve"], cwd=REPO,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=REPO),
                             preexec_fn=lambda: os.umask(0o022))
    try:
        agent_request(serve, 1, "store_start", run_root=str(run_root), addr=RDZV_ADDR,
                      python=sys.executable)
        agent_request(serve, 2, "store_stop", run_root=str(run_root))
        for path in (tmp_path / "runs", run_root, run_root / "store.json",
                     run_root / "store.log"):
            assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    finally:
        serve.stdin.close()
        serve.wait(30)


def wait_line(proc):
    line = proc.stdout.readline()
    assert line, "the helper process died before it was ready"
    return line


ECHO = "import sys\nfor line in sys.stdin:\n    print(line.strip(), flush=True)\n"


def answers(proc) -> bool:
    """Whether ``proc`` (running ECHO) is alive to answer now. A signal sent to it before is
    acted on before it reads again, so an answer means no deadly one was sent."""
    try:
        proc.stdin.write(b"still there?\n")
        proc.stdin.flush()
    except BrokenPipeError:
        return False
    return proc.stdout.readline() == b"still there?\n"


def test_kill_leaves_a_process_group_that_is_not_the_runs():
    # A stranger leads a process group; one process in it carries the run's marker.
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time\n"
         "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
         " env=dict(os.environ, RANKDECK_RUN='grp/n0'))\n"
         "print(c.pid, flush=True)\n" + ECHO],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    try:
        marked = int(wait_line(stranger))
        assert procs.stat(marked).pgid == stranger.pid
        # The marker is in the child's environment once it has exec'd, not at fork (its
        # parent has none): the pid is printed before that, and on a loaded host the kill
        # came first and found no process of the run (the fresh-clone suite, a CPU hog beside).
        wait_for_sync(lambda: procs.run_pids(None, "grp/n0") == [marked], 30,
                      "the marked child to carry the marker", every=0.02)
        report = procs.kill_run(None, "grp/n0", grace=5.0)
        assert report["left"] == [] and not procs.alive(marked)
        assert answers(stranger), "the kill reached a process that is not the run's"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_pid_reused_since_the_snapshot_is_not_signalled(monkeypatch):
    """The snapshot listed a child of the run at a pid that now belongs to a bystander (the
    child ended and the pid was reused between the snapshot and the signal)."""
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bystander = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)
    real_table = procs.table
    calls = []

    def stale_first_snapshot():
        out = real_table()
        if not calls:
            now = out[bystander.pid]
            out[bystander.pid] = procs.ProcInfo(bystander.pid, root.pid, now.pgid, now.sid,
                                                "S", now.starttime - 1, "worker")
        calls.append(1)
        return out

    monkeypatch.setattr(procs, "table", stale_first_snapshot)
    try:
        report = procs.kill_run(root.pid, None, grace=2.0)
        assert report["sigterm"] == [bystander.pid]  # what the stale snapshot said
        assert answers(bystander), "a reused pid was signalled"
    finally:
        for p in (root, bystander):
            p.kill()
            p.wait()


def reused_at_the_signal(monkeypatch, pid, starttime):
    """procs.stat says ``pid`` started at ``starttime`` (the recorded process's) until the
    first attempt to signal it, the truth from then on: the recorded process ended and its
    pid went to a bystander between the check and the signal."""
    real_stat, real_kill = procs.stat, os.kill
    reused = []

    def stat(p):
        info = real_stat(p)
        if p != pid or reused or info is None:
            return info
        return procs.ProcInfo(p, info.ppid, info.pgid, info.sid, info.state, starttime,
                              info.comm)

    def kill(p, sig):
        reused.append(p)
        real_kill(p, sig)
    monkeypatch.setattr(procs, "stat", stat)
    monkeypatch.setattr(os, "kill", kill)
    if hasattr(os, "pidfd_open"):
        real_open = os.pidfd_open

        def pidfd_open(p, *flags):
            reused.append(p)
            return real_open(p, *flags)
        monkeypatch.setattr(os, "pidfd_open", pidfd_open)


def signalled_by_us_only(proc):
    """True when the process dies of our own SIGKILL now, not of a SIGTERM or SIGUSR1 sent
    earlier: a fatal signal sets the exit status as it is sent, so no wait is needed."""
    proc.kill()
    return proc.wait() == -signal.SIGKILL


@pytest.mark.parametrize("op", ["stop", "restart"])
def test_a_supervisor_pid_reused_before_the_signal_is_not_signalled(tmp_path, monkeypatch, op):
    """stop and restart signal the node's supervisor by the pid state.json records: the
    check that it is still that process and the signal must reach one process (a pidfd)."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ndir = tmp_path / "run" / "n0"
        ndir.mkdir(parents=True)
        recorded = procs.stat(bystander.pid).starttime - 1  # the supervisor that had the pid
        (ndir / "state.json").write_text(json.dumps({
            "run_id": "r-reused", "node": "n0", "pid": bystander.pid, "starttime": recorded,
            "state": "running", "grace": 1.0}))
        reused_at_the_signal(monkeypatch, bystander.pid, recorded)
        state = getattr(node_ops, op)({"run_root": str(tmp_path / "run"), "node": "n0",
                                       "timeout": 5})
        assert state["state"] == "lost" and not state["alive"], state
    finally:
        assert signalled_by_us_only(bystander), "a reused pid was signalled"


def test_a_store_pid_reused_before_the_signal_is_not_signalled(tmp_path, monkeypatch):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_root = tmp_path / "r1"
        run_root.mkdir()
        recorded = procs.stat(bystander.pid).starttime - 1  # the store that had the pid
        (run_root / "store.json").write_text(json.dumps({
            "pid": bystander.pid, "starttime": recorded, "port": 1}))
        reused_at_the_signal(monkeypatch, bystander.pid, recorded)
        stop_store(str(run_root))
    finally:
        assert signalled_by_us_only(bystander), "a reused pid was signalled"


STRAGGLER = r"""
import signal, sys, time
def save_then_exit(*_):
    time.sleep(3)  # saving a checkpoint on SIGTERM, within the run's --grace of 10 s
    open(sys.argv[1], "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save_then_exit)
print("ready", flush=True)
time.sleep(120)
"""


def test_stop_sweep_waits_the_runs_grace_not_two_seconds(tmp_path):
    """`stop` on a node whose supervisor is gone sweeps what still carries the run's marker:
    it must give those processes the run's --grace to end, as the supervisor would have."""
    ndir = tmp_path / "run" / "n0"
    ndir.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (ndir / "state.json").write_text(json.dumps({
        "run_id": "r-grace", "node": "n0", "pid": gone.pid, "starttime": 1,
        "state": "running", "grace": 10.0}))
    saved = tmp_path / "saved"
    straggler = subprocess.Popen([sys.executable, "-c", STRAGGLER, str(saved)],
                                 stdout=subprocess.PIPE,
                                 env=dict(os.environ, RANKDECK_RUN="r-grace/n0"))
    try:
        wait_line(straggler)
        state = node_ops.stop({"run_root": str(tmp_path / "run"), "node": "n0"})
        assert state["sweep"]["killed"] == [] and state["left"] == []
        assert saved.read_text() == "saved"
        assert straggler.wait(5) == 0
    finally:
        if straggler.poll() is None:
            straggler.send_signal(signal.SIGKILL)
            straggler.wait()
