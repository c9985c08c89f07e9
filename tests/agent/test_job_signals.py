"""Issue 40 (Low 7): on a Slurm proctrack/cgroup site a job's ``--signal=USR1@90`` or
``scancel --signal`` reaches every process of its steps, the agent's own among them. The
long-lived agent processes take their requests only from serve: the rankdeck-host step, the
judge and the store live on through SIGUSR1 and SIGUSR2 (their default would end them), and a
supervisor restarts torchrun or puts a spare in only when serve asked (agent/node/folder.py
``ask_by_signal``): a bare SIGUSR1 restarts nothing, serve's restart still does. Real
processes, signalled as Slurm's step daemon would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from agent.host import procs
from agent.judge.control import running_judge, start_judge, stop_judge
from agent.node import folder as node, ops as node_ops
from agent.slurm import host_step
from agent.store.tcpstore import start_store, stop_store
from tests.agent.test_expel import keep_store_up
from tests.spine.helpers import HOST_PYTHON
from tests.waits import wait_for_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTLE_S = 1.0  # a signal's default action ends a process at once; this is ample


def slurm_signals(pid: int) -> None:
    """What ``scancel --signal=USR1`` then ``--signal=USR2`` does to a step's process."""
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        os.kill(pid, sig)
        time.sleep(SETTLE_S / 2)


def test_the_host_step_lives_on_through_the_job_s_signals(tmp_path):
    job = "t" + uuid.uuid4().hex[:8]
    proc = subprocess.Popen([sys.executable, "-m", "agent", "host", job],
                            env=dict(os.environ, PYTHONPATH=REPO), cwd=str(tmp_path))
    try:
        wait_for_sync(lambda: host_step.up({host_step.JOB_ENV: job}), 30, "the host answering")
        slurm_signals(proc.pid)
        assert proc.poll() is None and host_step.up({host_step.JOB_ENV: job})
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_the_judge_and_the_store_live_on_through_the_job_s_signals(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(os.path.join(run_root, "node0"))
    keep_store_up(run_root)
    store = start_store(run_root, "127.0.0.1", HOST_PYTHON)
    judge = start_judge(run_root, {"addr": "127.0.0.1", "token": "t0ken-" + "x" * 20,
                                   "nodes": ["node0"], "stall_after": 60.0})
    try:
        for pid in (store["pid"], judge["pid"]):
            slurm_signals(pid)
        assert running_judge(run_root) is not None
        assert procs.alive(store["pid"])
    finally:
        stop_judge(run_root)
        stop_store(run_root)
    wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


@pytest.fixture
def supervised(tmp_path):
    run_root = tmp_path / "runs" / "r1"
    args = {"run_root": str(run_root), "node": "n0", "spec": {
        "run_id": "r1", "node": "n0", "cwd": str(tmp_path),
        "argv": [sys.executable, "-c", "import time; time.sleep(600)"]}}
    state = node_ops.start(args)
    ndir = str(run_root / "n0")
    wait_for_sync(lambda: (node.node_state(ndir) or {}).get("state") == "running", 60,
                  "the node running")
    yield args, ndir, state
    node_ops.stop(dict(args, timeout=30))


def test_a_supervisor_takes_a_restart_only_from_serve(supervised):
    args, ndir, state = supervised
    before = node.node_state(ndir)
    slurm_signals(before["pid"])
    time.sleep(SETTLE_S)
    now = node.node_state(ndir)
    assert now["alive"] and now["state"] == "running"
    assert now.get("launches") == before.get("launches")  # nothing restarted
    assert now.get("torchrun_pid") == before.get("torchrun_pid")
    with open(os.path.join(ndir, "supervisor.log")) as f:
        assert "SIGUSR1 ignored" in f.read()
    restarted = node_ops.restart(dict(args, timeout=60))  # serve's restart still works
    assert restarted["launches"] == before["launches"] + 1 and restarted["alive"]
