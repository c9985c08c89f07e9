"""A cordoned node's fence (agent/node/fence.py): once fenced, nothing of the run starts on it
again (start, restart, the judge's restart through its link) until it is unfenced."""

from __future__ import annotations

import os

import pytest

from agent.node import folder as node, fence as node_fence, ops as node_ops
from agent.wire.protocol import RequestError


def args(tmp_path, **more) -> dict:
    return dict(run_root=str(tmp_path / "run"), node="node2", **more)


def test_a_fenced_node_refuses_start_and_restart_until_unfenced(tmp_path):
    done = node_fence.fence(args(tmp_path, fence={"who": "alice@laptop", "why": "cordoned"}),
                            node_ops.stop)
    # a spare that never ran: fenced, nothing to stop, nothing left
    assert done == {"state": "missing", "left": [], "fenced": True, "gpu": "nothing ran"}
    spec = {"run_id": "r1", "argv": ["true"]}
    for op in (node_ops.start, node_ops.restart):
        with pytest.raises(RequestError) as err:
            op(args(tmp_path, spec=spec))
        assert err.value.kind == "fenced" and "uncordon" in str(err.value)
    assert not os.path.exists(os.path.join(str(tmp_path / "run"), "node2", "state.json"))

    assert node_fence.unfence(args(tmp_path)) == {"unfenced": True}
    node_fence.refuse_if_fenced(node.node_dir(args(tmp_path)))  # no longer raises
    assert node_fence.unfence(args(tmp_path)) == {"unfenced": False}


def test_the_gpu_check_of_a_stop_in_words():
    """What a fence says of the GPU memory its processes held
    (agent/supervisor/launcher.py gpu_after_kill's report): freed, still held (the surgery
    fails), or no GPU to check."""
    assert node_fence.gpu_words(None) == "no GPU"
    assert node_fence.gpu_words({"held": 0, "pids": []}) == "freed"
    assert node_fence.gpu_words({"held": 3 << 30, "pids": [41, 42]}) == \
        "held: 3072 MiB by pid(s) 41,42"


def test_a_fence_ends_the_node_stopped_with_why_and_a_hung_node_without_grace(tmp_path,
                                                                                monkeypatch):
    """What the fence hands the supervisor's stop (STOP_END, read by Supervisor.stop_end):
    the end (stopped, why), and grace 0 for a node judged hung: SIGKILL at once."""
    from agent.host.runfiles import write_json_atomic
    from agent.supervisor.supervisor import Supervisor
    ndir = tmp_path / "run" / "node2"
    ndir.mkdir(parents=True)
    written = []
    monkeypatch.setattr(node, "node_state", lambda d: {"alive": True})  # a supervisor runs
    out = node_fence.fence(args(tmp_path, fence={"who": "alice@laptop", "why": "cordoned by a"},
                                grace=0),
                           lambda a: written.append(a["end"]) or {"left": []})  # its stop
    assert out["fenced"] and out["gpu"] == "no GPU"  # no kill report: no NVML figures
    assert written == [{"state": "stopped", "grace": 0, "cause": {"message": "cordoned by a"}}]
    sup = Supervisor.__new__(Supervisor)  # stop_end reads only the node's folder
    sup.node_dir = str(ndir)
    write_json_atomic(str(ndir / node_ops.STOP_END), written[0])
    assert sup.stop_end() == {"state": "stopped", "grace": 0.0,
                              "cause": {"message": "cordoned by a", "rank": None}}
    assert sup.stop_end() == {"state": "stopped", "cause": None, "grace": None}  # read once


def test_drop_workers_kills_the_marked_workers_of_a_live_torchrun_and_leaves_it(tmp_path):
    """A hung node's cordon, on another node of the run: its workers (torchrun's children
    that carry the run's marker) are SIGKILLed so that its torchrun, which stays, starts
    them again; a child without the marker and torchrun itself are left alone. Nothing to
    do without a live supervisor; refused on a fenced node."""
    import signal
    import subprocess
    import sys

    from agent.host import procs
    from agent.host.runfiles import write_json_atomic
    assert node_fence.drop_workers(args(tmp_path)) == {"killed": []}  # never ran here
    env = dict(os.environ, **{procs.MARKER: "r1/node2"})
    sleeper = "import time; time.sleep(120)"
    # a stand-in torchrun: a marked worker, and a child it starts without the marker
    torchrun = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys\n"
        "env = {k: v for k, v in os.environ.items() if k != %r}\n"
        "a = subprocess.Popen([sys.executable, '-c', %r])\n"
        "b = subprocess.Popen([sys.executable, '-c', %r], env=env)\n"
        "print(a.pid, b.pid, flush=True)\n"
        "a.wait(); print('worker gone', a.returncode, flush=True)\n"
        "b.wait()\n") % (procs.MARKER, sleeper, sleeper)],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        worker, unmarked = (int(p) for p in torchrun.stdout.readline().split())
        ndir = tmp_path / "run" / "node2"
        ndir.mkdir(parents=True)
        me = procs.stat(os.getpid())  # the supervisor: alive, as state.json says
        write_json_atomic(str(ndir / "state.json"), {
            "run_id": "r1", "node": "node2", "pid": me.pid, "starttime": me.starttime,
            "state": "running", "torchrun_pid": torchrun.pid})
        assert node_fence.drop_workers(args(tmp_path)) == {"killed": [worker]}
        assert torchrun.stdout.readline().split() == ["worker", "gone", str(-signal.SIGKILL)]
        assert torchrun.poll() is None and procs.alive(unmarked)
        node_fence.mark_fenced(str(ndir), {"who": "alice@laptop"})
        with pytest.raises(RequestError) as err:
            node_fence.drop_workers(args(tmp_path))
        assert err.value.kind == "fenced"
    finally:
        for pid in procs.descendants(torchrun.pid):
            os.kill(pid, signal.SIGKILL)
        torchrun.kill()
        torchrun.wait()
