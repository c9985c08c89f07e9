"""agent/host/procs.py ``stop_pids``: processes named one by one (pid and start time) are
stopped by SIGTERM, those that ignore it by SIGKILL after the grace, a stopped one is
continued so it can act on SIGTERM, and a pid whose start time differs is never signalled."""

import subprocess
import sys
import threading
import time

from agent.host import procs

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
SLEEPS = "import time; print(1, flush=True); time.sleep(60)"


def started(code):
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    proc.stdout.readline()  # its handlers are set
    return proc, procs.stat(proc.pid).starttime


def reaped_soon(proc):
    """The test is their parent: each is reaped as it ends, so ``alive`` sees no zombie."""
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    return proc.returncode


def test_term_then_kill_then_checked_gone():
    polite, polite_start = started(SLEEPS)
    stubborn, stubborn_start = started(IGNORES_TERM)
    stopped, stopped_start = started(SLEEPS)
    stopped.send_signal(19)  # SIGSTOP: only SIGCONT lets it act on SIGTERM
    waits = [threading.Thread(target=reaped_soon, args=(p,)) for p in (polite, stubborn, stopped)]
    for t in waits:
        t.start()
    left = procs.stop_pids({polite.pid: polite_start, stubborn.pid: stubborn_start,
                            stopped.pid: stopped_start}, grace=1.0)
    for t in waits:
        t.join()
    assert left == []
    assert polite.returncode == -15 and stopped.returncode == -15
    assert stubborn.returncode == -9


def test_a_pid_with_another_start_time_is_left_alone():
    proc, start = started(SLEEPS)
    try:
        left = procs.stop_pids({proc.pid: start + 1}, grace=0.2, settle=0.2)
        time.sleep(0.2)
        assert proc.poll() is None
        assert left == []  # not the process it names: that one is gone
    finally:
        proc.kill()
        proc.wait()
