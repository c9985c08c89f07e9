"""A requeued Slurm job's wait on a real supervisor (agent/supervisor/supervisor.py on_requeue): the ranks
end while the job is back in the queue, and a torchrun that takes its time to exit after its
workers (1.2-2 s of teardown, docs/BENCHMARKS.md) is not taken for the run failing. squeue is
a small script that answers what the test writes; tests/slurm has the real one."""

from __future__ import annotations

import os
import sys

from agent.node import folder as node, ops as node_ops
from agent.host import procs
from tests.unit.test_slurm_limit import slurm_commands
from tests.waits import wait_for_sync

# torchrun's part: one worker; on SIGTERM, forwards it, waits for the worker, then tears down
# for 1.5 s before it exits 1 (as torchrun does once its workers died of its signal)
SLOW_TORCHRUN = """
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
def down(*_):
    os.kill(worker.pid, signal.SIGTERM); os.waitpid(worker.pid, 0); time.sleep(1.5); sys.exit(1)
signal.signal(signal.SIGTERM, down)
while True:
    time.sleep(1)
"""


def test_a_torchrun_slow_to_exit_as_the_job_is_requeued_leaves_the_run_waiting(
        tmp_path, monkeypatch):
    squeue, _scontrol, answer, _calls = slurm_commands(tmp_path)
    answer.write_text("RUNNING|None|9:00|node[0-3]|2026-11-26T07:00:00\n")
    monkeypatch.setenv("PATH", "%s%s%s" % (tmp_path, os.pathsep, os.environ["PATH"]))
    monkeypatch.setenv("RANKDECK_SLURM_JOB", "41")
    assert os.path.dirname(squeue) == str(tmp_path)
    run_root = str(tmp_path / "run")
    args = {"run_root": run_root, "node": "node1"}
    node_ops.start(dict(args, spec={
        "run_id": "r1", "node": "node1", "cwd": str(tmp_path), "grace": 30,
        "argv": [sys.executable, "-c", SLOW_TORCHRUN],
        "slurm_limit": {"signal_before": None, "requeue": True, "requeuer": False}}))
    ndir = node.node_dir(args)
    try:
        wait_for_sync(lambda: len(procs.run_pids(None, "r1/node1")) == 2, 30, "the worker")
        answer.write_text("PENDING|BeginTime|5:00|\n")  # requeued by another node

        def settled():  # the wait over (torchrun reaped), or the run ended
            st = node.node_state(ndir) or {}
            over = st.get("state") not in (None, "running", "restarting")
            return (over or (st.get("state") == "restarting" and st.get("exiting") == []
                             and not procs.run_pids(None, "r1/node1"))) and st
        waiting = wait_for_sync(settled, 60, "the ranks ended, the run waiting")
        # torchrun's exit, 1.5 s after its worker's, is the wait's, not the run's end: the old
        # torchrun is no longer the run's (a later turn would have taken its exit for one)
        assert waiting["state"] == "restarting" and waiting["alive"], waiting
        assert waiting["torchrun_pid"] is None, waiting
        assert "requeued (BeginTime)" in waiting["cause"]["message"], waiting
        answer.write_text("RUNNING|None|5:00|node[0-3]|2026-11-26T07:09:00\n")
        again = wait_for_sync(lambda: (node.node_state(ndir) or {}).get("state") == "running"
                              and len(procs.run_pids(None, "r1/node1")) == 2
                              and node.node_state(ndir), 60, "the ranks started again")
        assert again["restarts"] == 1, again
    finally:
        if node.node_state(ndir) and node.node_state(ndir)["alive"]:
            node_ops.stop(dict(args, timeout=30))
        for pid in procs.run_pids(None, "r1/node1"):
            os.kill(pid, 9)


# torchrun's part when the job is cancelled under it: Slurm ends the job (squeue says
# CANCELLED) and kills what it tracks of it, here this process, before the supervisor's next
# look at squeue (every 5 s)
CANCELLED_UNDER_IT = """
import sys, time
time.sleep(2)
open(sys.argv[1], "w").write("CANCELLED|None|0:00|node[0-3]|2026-11-26T07:00:00\\n")
sys.exit(1)
"""


def test_a_torchrun_killed_as_its_job_is_cancelled_ends_the_node_stopped_with_the_reason(
        tmp_path, monkeypatch):
    """The scancel race (tests/slurm/test_slurm_run.py saw it once): the node's torchrun
    failed before its supervisor looked at squeue; the job's end, not the run's failure."""
    squeue, _scontrol, answer, _calls = slurm_commands(tmp_path)
    answer.write_text("RUNNING|None|9:00|node[0-3]|2026-11-26T07:00:00\n")
    monkeypatch.setenv("PATH", "%s%s%s" % (tmp_path, os.pathsep, os.environ["PATH"]))
    monkeypatch.setenv("RANKDECK_SLURM_JOB", "41")
    run_root = str(tmp_path / "run")
    args = {"run_root": run_root, "node": "node1"}
    node_ops.start(dict(args, spec={
        "run_id": "r1", "node": "node1", "cwd": str(tmp_path), "grace": 30,
        "argv": [sys.executable, "-c", CANCELLED_UNDER_IT, str(answer)]}))
    ndir = node.node_dir(args)
    ended = wait_for_sync(lambda: (node.node_state(ndir) or {}).get("state") not in (
        None, "starting", "running") and node.node_state(ndir), 60, "the node's end")
    assert ended["state"] == "stopped", ended
    assert ended["cause"]["message"] == ("Slurm job 41 was cancelled (scancel): the run ended "
                                         "with it"), ended
    assert ended["cause"]["slurm"] == "CANCELLED", ended
