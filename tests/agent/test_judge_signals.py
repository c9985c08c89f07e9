"""A read-only watcher's ``why`` through the run's judge sends the ranks no signal
(docs/SECURITY.md, "Read-only consoles"): serve (agent/serve/server.py) asks the judge for a
verdict without signals, the judge (agent/judge/sample.py) asks every node so, and each
supervisor's link (agent/supervisor/judge_link.py) takes its ranks' stacks from py-spy alone
(agent/torchrun/stacks.py). Where py-spy is missing, a report with signals SIGCONTs a stopped
rank and SIGUSR1s every rank that catches it; a watcher's used to.

Real parts: a judge, a supervisor started as serve starts one, whose launcher is the rank (a
Python process with RANK in its environment and a SIGUSR1 handler that writes down each
signal), serve's request handler. The host has no py-spy: the supervisor runs on an
interpreter with none beside it, and PATH holds none."""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest

from agent.host import procs
from agent.host.runfiles import read_json
from agent.judge.control import running_judge, start_judge, stop_judge
from agent.node import ops as node_ops
from agent.serve import server as serve
from tests.agent.test_judge import TOKEN
from tests.agent.test_serve_roles import Out, ask
from tests.waits import wait_for_sync

RANK = r'''
import os, signal, sys, time
out = sys.argv[1]
def got(signum, _frame):
    with open(os.path.join(out, "signals"), "a") as f:
        f.write("%d\n" % signum)
    sys.stderr.write('Thread 0x1 (most recent call first):\n  File "rank.py", line 6 in got\n')
    sys.stderr.flush()
signal.signal(signal.SIGUSR1, got)
open(os.path.join(out, "ready"), "w").close()
while True:
    time.sleep(0.2)
'''


def no_py_spy(monkeypatch):
    """This host without py-spy: an interpreter with none beside it for the supervisor
    (agent/torchrun/stacks.py looks there and on PATH), and a PATH with none."""
    python = os.path.realpath(sys.executable)
    if os.path.exists(os.path.join(os.path.dirname(python), "py-spy")):
        pytest.skip("py-spy sits beside every interpreter here")
    monkeypatch.setattr(sys, "executable", python)  # what node_ops starts the supervisor with
    monkeypatch.setenv("PATH", os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not os.path.exists(os.path.join(d, "py-spy"))))
    assert shutil.which("py-spy") is None
    return python


@pytest.fixture
def node_with_a_rank(tmp_path, monkeypatch):
    python = no_py_spy(monkeypatch)
    run_root = str(tmp_path / "w" / ".rankdeck" / "runs" / "r1")  # a watcher names no other
    os.makedirs(run_root)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0"],
                                  "stall_after": 3600.0})  # no look of the judge's own
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    where = {"run_root": run_root, "node": "node0"}
    try:
        node_ops.start(dict(where, spec={
            "run_id": "r1", "node": "node0", "cwd": str(tmp_path),
            "env": {"RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
            "argv": [python, str(script), str(tmp_path)],
            "judge": {"addr": "127.0.0.1", "port": info["port"], "token": TOKEN}}))
        ndir = os.path.join(run_root, "node0")
        wait_for_sync(lambda: (tmp_path / "ready").exists(), 60, "the rank's handler set")
        wait_for_sync(lambda: "connected to the judge" in open(
            os.path.join(ndir, "supervisor.log")).read(), 60, "node0 linked to the judge")
        pid = read_json(os.path.join(ndir, "state.json"))["torchrun_pid"]
        yield run_root, pid, tmp_path / "signals"
    finally:
        if os.path.exists(os.path.join(run_root, "node0", "state.json")):
            node_ops.stop(dict(where, timeout=30))
        stop_judge(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def pending(pid, signum):
    """Whether ``signum`` waits for the stopped process (its handler runs once it resumes)."""
    with open("/proc/%d/status" % pid) as f:
        masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(m & (1 << (signum - 1)) for m in masks)


def signalled(path):
    return path.read_text().split() if path.exists() else []


def why(read_only, run_root):
    out = Out()
    server = serve.Server(out=out)
    crafted = {}
    if read_only:
        assert ask(server, out, "hello", role="watch", who="bob@laptop")["ok"]
        crafted = {"args": {"signals": True}}  # a watcher's request typed by hand: no matter
    answer = ask(server, out, "judge", run_root=run_root, ask="why", timeout=90, **crafted)
    assert answer["ok"], answer
    return answer["data"]


def test_a_watchers_why_through_the_judge_sends_the_ranks_no_signal(node_with_a_rank):
    run_root, pid, signals = node_with_a_rank
    os.kill(pid, signal.SIGSTOP)  # an operator stopped the rank
    wait_for_sync(lambda: procs.stat(pid).state == "T", 30, "the rank stopped")
    verdict = why(True, run_root)
    assert verdict["kind"] != "unreachable" and "did not report" not in verdict["summary"], \
        verdict  # node0 was asked, and answered for rank 0
    assert procs.stat(pid).state == "T"  # not resumed (SIGCONT)
    assert not pending(pid, signal.SIGUSR1) and signalled(signals) == []
    # a driving console's verdict may signal: the rank resumes and writes its stack
    why(False, run_root)
    got = wait_for_sync(lambda: signalled(signals), 30, "the driver's SIGUSR1 handled")
    assert set(got) == {str(int(signal.SIGUSR1))} and procs.stat(pid).state != "T", got
    # a watcher's why on the running rank: still none
    why(True, run_root)
    assert signalled(signals) == got
