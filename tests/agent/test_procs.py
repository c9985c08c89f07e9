"""Verified kill: workers in sessions of their own and stopped processes included."""

import os
import subprocess
import sys

from agent.host import procs
from tests.waits import wait_for_sync

# A parent that starts a child in a new session (as torchrun starts workers), which starts a
# grandchild and stops itself (SIGSTOP), then the parent sleeps.
TREE = r"""
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "time.sleep(0.3); os.kill(os.getpid(), signal.SIGSTOP); time.sleep(600)"],
    start_new_session=True)
print(child.pid, flush=True)
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # a parent that ignores SIGTERM
time.sleep(600)
"""


def test_kill_run_reaches_new_sessions_and_stopped_processes():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE,
                            env=dict(os.environ, RANKDECK_RUN="test/nodeX"))
    try:
        child = int(root.stdout.readline())
        # the child has started its grandchild and stopped itself: the tree the kill must reach
        wait_for_sync(lambda: len(procs.descendants(root.pid)) == 2 and
                      procs.stat(child).state == "T", 30, "the child stopped, its child started")
        below = procs.descendants(root.pid)
        assert child in below and len(below) == 2
        assert procs.stat(child).sid != procs.stat(root.pid).sid  # its own session
        marked = procs.marked("test/nodeX")
        assert root.pid in marked and child in marked
        report = procs.kill_run(os.getpid(), "test/nodeX", grace=1.0, first=root.pid)
        root.wait(timeout=5)
        assert report["left"] == [] and report["dstate"] == []
        assert root.pid in report["killed"]  # it ignored SIGTERM: SIGKILL after the grace
        for pid in below:
            assert not procs.alive(pid)
        assert procs.marked("test/nodeX") == []
    finally:
        if root.poll() is None:
            root.kill()


def test_stat_parses_names_with_spaces_and_parentheses(tmp_path):
    exe = tmp_path / "odd) name ("
    os.symlink(sys.executable, exe)
    p = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
    try:
        def execed() -> bool:  # the kernel's own name for it, once it runs the odd name
            with open("/proc/%d/comm" % p.pid) as f:
                return f.read() == "odd) name (\n"
        wait_for_sync(execed, 30, "the exec of the oddly named interpreter")
        info = procs.stat(p.pid)
        # D: still reading its modules from disk, under load
        assert info.comm == "odd) name (" and info.ppid == os.getpid() and info.state in "SRD"
    finally:
        p.kill()
        p.wait()


# torchrun's shape on SIGTERM: forward it to the worker, wait for it, then take a while to
# exit (its own teardown: 1.2-2 s on this machine).
LINGERING = r"""
import os, signal, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
def on_term(*_):
    worker.terminate(); worker.wait()
    time.sleep(%s)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print(worker.pid, flush=True)
time.sleep(600)
"""


def _lingering(linger_s):
    root = subprocess.Popen([sys.executable, "-c", LINGERING % linger_s], stdout=subprocess.PIPE,
                            env=dict(os.environ, RANKDECK_RUN="test/nodeL"))
    return root, int(root.stdout.readline())


def test_a_restart_leaves_torchrun_exiting_once_its_workers_are_gone():
    root, worker = _lingering(600)
    try:
        report = procs.kill_run(os.getpid(), "test/nodeL", grace=30.0, first=root.pid,
                                leave_first=True)
        assert not procs.alive(worker)
        assert root.poll() is None and procs.alive(root.pid)  # still exiting: not waited for
        exiting = report["exiting"]
        assert exiting["pid"] == root.pid
        assert exiting["starttime"] == procs.stat(root.pid).starttime
        assert report["killed"] == [] and report["left"] == []
        assert "gone_s" not in report and report["others_gone_s"] >= 0
    finally:
        root.kill()
        root.wait()


def test_a_stop_waits_for_torchrun_itself():
    root, worker = _lingering(0.5)
    try:
        report = procs.kill_run(os.getpid(), "test/nodeL", grace=30.0, first=root.pid)
        root.wait(timeout=5)
        assert "exiting" not in report and report["killed"] == [] and report["left"] == []
        assert not procs.alive(worker) and report["gone_s"] >= report["others_gone_s"]
    finally:
        if root.poll() is None:
            root.kill()
