"""The judge's cordon policy (agent/judge/cordon.py, ``launch --auto-cordon``) on its own: a
real judge and its journal, nodes spoken for by FakeNode (tests/agent/test_judge.py), and a
real supervisor started for the spare from the spec kept on the judge's host. The whole path
with real torchrun is tests/spine/test_auto_cordon.py."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
import threading
import types

import pytest

from agent.host import procs
from agent.node import folder as node, fence as node_fence, ops as node_ops
from agent.judge.control import running_judge, start_judge, stop_judge
from tests.agent.test_judge import TOKEN, FakeNode, events, fr, rank_1_hangs, stack
from tests.waits import wait_for_sync


class FencedNode(FakeNode):
    """A node whose supervisor, asked to fence, stops and says so in its last state."""

    def answered(self, msg):
        if msg.get("op") == "fence":
            self.fenced = msg.get("args")
            self.line.send({"t": "state", "state": {"state": "stopped", "left": [],
                                                    "gpu": None, "sent": time.time()}})


def judge_with(tmp_path, **settings):
    run_root = str(tmp_path / "run")
    os.makedirs(run_root, exist_ok=True)
    spec = dict({"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0", "node1"],
                 "stall_after": 2.0, "auto_cordon": True, "spares": ["node2"],
                 "nnodes_min": 2}, **settings)
    return run_root, start_judge(run_root, spec)


@pytest.fixture
def stopped_after(tmp_path):
    roots = []
    yield roots
    for run_root in roots:
        stop_judge(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")
        spare = {"run_root": run_root, "node": "node2"}
        if node.node_state(node.node_dir(spare)):
            node_ops.stop(dict(spare, timeout=30))


def test_auto_cordon_fences_the_node_and_starts_the_spare_from_its_kept_spec(tmp_path,
                                                                              stopped_after):
    run_root, info = judge_with(tmp_path)
    stopped_after.append(run_root)
    # what the console hands the spare's host at launch (0600: the env's secrets are in it)
    node_fence.standby({"run_root": run_root, "node": "node2", "spec": {
        "run_id": "r1", "node": "node2", "cwd": str(tmp_path), "env": {"TOKEN": "s3cret"},
        "argv": [sys.executable, "-c", "import time; time.sleep(120)"]}})
    kept = os.path.join(run_root, "node2", node_fence.STANDBY)
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    n0 = FencedNode(info["port"], "node0", {"ranks": []})
    n1 = FencedNode(info["port"], "node1", {"ranks": []})
    n1.send({"k": "event", "what": "restarting"}, {"k": "event", "what": "launched"})
    n1.send({"k": "event", "what": "worker_failed", "rank": 1, "exit_code": 1})  # again
    outcome = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "surgery"
                                     and e.get("action") == "outcome"], 60, "the outcome")[0]
    assert outcome["outcome"] == "done" and outcome["who"] == "judge", outcome
    assert (outcome["out"], outcome["in"], outcome["gpu"]) == ("node1", "node2", "no GPU")
    assert n1.asked == ["fence"] and "--auto-cordon" in n1.fenced["why"] and "fence" \
        not in n0.asked
    started = node.node_state(os.path.join(run_root, "node2"))
    assert started["alive"] and started["state"] == "running", started
    assert not os.path.exists(kept)  # the spec is in the supervisor's memory only now
    texts = [e["text"] for e in events(run_root) if e["what"] in ("policy", "surgery")]
    assert any("--auto-cordon: cordon node1, spare node2 in (rank 1 " in t for t in texts), texts


def test_auto_cordon_of_a_hung_node_kills_the_workers_stalled_with_it(tmp_path, stopped_after):
    """Every rank stalled (node1's rank 1 hangs again after its restart, node0's rank 0 waits
    for it in a collective): the judge's cordon of node1 has node0's supervisor kill its
    workers (``drop_workers``), as a console's cordon does, so its torchrun rejoins at once."""
    run_root, info = judge_with(tmp_path)
    stopped_after.append(run_root)
    node_fence.standby({"run_root": run_root, "node": "node2", "spec": {
        "run_id": "r1", "node": "node2", "cwd": str(tmp_path),
        "argv": [sys.executable, "-c", "import time; time.sleep(120)"]}})
    n0 = FakeNode(info["port"], "node0", {"ranks": [
        {"pid": 10, "rank": 0, "stack": stack("wait"), "fr": fr(5, False)}]})
    n1 = FencedNode(info["port"], "node1", {"ranks": [
        {"pid": 11, "rank": 1, "stack": stack("sleep"), "fr": fr(4, True)}]})
    n1.send({"k": "event", "what": "restarting"}, {"k": "event", "what": "launched", "launch": 2})
    for n, rank in ((n0, 0), (n1, 1)):
        n.send({"k": "file", "f": 1, "rank": rank})
        n.send(*({"k": "metric", "f": 1, "step": step, "step_time": 0.1} for step in range(3)))
    outcome = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "surgery"
                                     and e.get("action") == "outcome"], 60, "the outcome")[0]
    assert (outcome["out"], outcome["in"], outcome["outcome"]) == ("node1", "node2", "done")
    assert n0.asked.count("drop_workers") == 1 and "fence" not in n0.asked, n0.asked
    assert "drop_workers" not in n1.asked, n1.asked


def test_a_nodes_link_kills_its_workers_when_the_judge_asks(tmp_path):
    """``drop_workers`` through a node's link (agent/supervisor/judge_link.py), answered as the agent's
    op is (agent/node/fence.py; its kills are tests/agent/test_fence.py's): a node that runs no
    torchrun here has nothing to kill."""
    from agent.supervisor import judge_link
    ndir = tmp_path / "run" / "node1"
    ndir.mkdir(parents=True)
    link = judge_link.JudgeLink({}, "node1", str(ndir), dict, dict, lambda _t: None)
    sent = []
    link._answer(types.SimpleNamespace(send=sent.append), {"op": "drop_workers", "id": 3})
    assert sent == [{"t": "res", "id": 3, "ok": True, "data": {"killed": []}}]


def test_auto_cordon_without_a_spare_or_room_to_shrink_does_nothing_and_says_why(
        tmp_path, stopped_after):
    run_root, info = judge_with(tmp_path)  # no kept spec: no spare this judge can start
    stopped_after.append(run_root)
    rank_1_hangs(info["port"], "sleep", restarted=True)
    said = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "policy"], 60,
                         "the policy's answer")[0]
    assert said["action"] == "none" and "--nnodes needs 2" in said["text"], said
    assert not any(e["what"] == "surgery" for e in events(run_root))


def test_a_nodes_link_fences_it_before_it_stops(tmp_path, monkeypatch):
    """The judge's ``fence`` through a node's own link (agent/supervisor/judge_link.py), the
    fence serve runs (agent/node/door.py): fenced.json first (no start or restart from then
    on), then the supervisor's stop (its own SIGTERM, caught here), sent once the judge has
    its answer, ending ``stopped`` with the judge's reason; in the node's action log as the
    judge's, with its reason."""
    from agent.supervisor import judge_link
    from agent.host import actions
    from agent.host.runfiles import read_json, write_json_atomic
    ndir = tmp_path / "run" / "node1"
    ndir.mkdir(parents=True)
    # this process stands for the node's supervisor, whose link answers the judge
    write_json_atomic(str(ndir / "state.json"), {"state": "running", "pid": os.getpid(),
                                                 "starttime": procs.stat(os.getpid()).starttime,
                                                 "run_id": "r1", "node": "node1"})
    link = judge_link.JudgeLink({}, "node1", str(ndir), dict, dict, lambda _t: None)
    sent = []
    monkeypatch.setattr(judge_link.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    link._answer(types.SimpleNamespace(send=sent.append), {"op": "fence", "id": 4, "args": {
        "who": "judge", "why": "cordoned by the judge (--auto-cordon): x", "grace": 0}})
    # no torchrun ran here: no member; the answer first, then the SIGTERM
    assert sent == [{"t": "res", "id": 4, "ok": True, "data": {"member": None, "fenced": True}},
                    (os.getpid(), signal.SIGTERM)]
    assert read_json(str(ndir / node_fence.FENCE))["who"] == "judge"
    # grace 0: a node the verdict named is hung, killed at once (Supervisor.stop_end)
    assert read_json(str(ndir / node_ops.STOP_END)) == {"state": "stopped", "grace": 0, "cause": {
        "message": "cordoned by the judge (--auto-cordon): x"}}
    with pytest.raises(Exception, match="cordoned"):
        node_fence.refuse_if_fenced(str(ndir))
    logged = actions.read(str(ndir))[0]
    assert [(a["action"], a["who"], a["result"], a["detail"]) for a in logged] == [
        ("cordon", "judge", "ok", "cordoned by the judge (--auto-cordon): x")]


def test_a_gpu_xid_is_journaled_by_the_node_and_its_judge_cordons_the_node(
        tmp_path, stopped_after, monkeypatch):
    """The Xid and ECC rule: the supervisor's telemetry (agent/host/stats.py, over the tests'
    fake NVML) journals ``gpu_error`` events; forwarded to the judge they propose the node for
    cordon, with no restart before, and --auto-cordon cordons it. Xids a job causes itself
    (45: a killed GPU process, as every fence makes) propose nothing."""
    from agent.host.stats import TelemetryRecorder
    from agent.rules.judge_view import RunView
    from tests.agent.test_gpu import FakeClock, full_pynvml
    nv = full_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    clock, journal = FakeClock(), []
    telemetry = TelemetryRecorder(types.SimpleNamespace(append=journal.append), str(tmp_path),
                                  every=10, clock=clock)
    telemetry.tick()  # primes the rates
    nv.pending += [(1, 79), (0, 45)]
    clock.now += 10
    telemetry.tick()
    errors = [r for r in journal if r.get("k") == "event"]
    # GPU 1 has 2 uncorrectable ECC errors since the driver loaded (full_pynvml)
    assert [(e["gpu"], e["error"]) for e in errors] == [
        (0, "Xid 45"), (1, "Xid 79"), (1, "2 uncorrectable ECC error(s)")], errors
    clock.now += 10
    telemetry.tick()  # each reported once
    assert len([r for r in journal if r.get("k") == "event"]) == 3

    view = RunView(["node0"], 60)
    assert view.apply("node0", errors[0], 0) == []  # Xid 45: the job's own
    assert RunView(["node0"], 60, 0).apply("node0", errors[1], 0) == []  # proposals off

    run_root, info = judge_with(tmp_path)
    stopped_after.append(run_root)
    node_fence.standby({"run_root": run_root, "node": "node2", "spec": {
        "run_id": "r1", "node": "node2", "cwd": str(tmp_path),
        "argv": [sys.executable, "-c", "import time; time.sleep(120)"]}})
    FencedNode(info["port"], "node0", {"ranks": []})
    n1 = FencedNode(info["port"], "node1", {"ranks": []})
    n1.send(*errors)
    outcome = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "surgery"
                                     and e.get("action") == "outcome"], 60, "the outcome")[0]
    assert (outcome["out"], outcome["in"], outcome["outcome"]) == ("node1", "node2", "done")
    proposed = [e for e in events(run_root) if e["what"] == "cordon proposed"]
    assert [e["text"] for e in proposed] == [
        "node1 proposed for cordon: GPU 1 reported Xid 79",
        "node1 proposed for cordon: GPU 1 reported 2 uncorrectable ECC error(s)"], proposed
    assert n1.asked == ["fence"]  # cordoned once


def test_auto_cordon_through_a_real_supervisor_fences_it_and_nothing_of_it_is_left(
        tmp_path, stopped_after):
    """The live path: a judge (in this process) and a real supervisor connected to it
    (agent/supervisor/judge_link.py); a proposal naming the node (a hang: SIGKILL at once) has the
    supervisor fence itself, stop, and say in its last state that nothing was left; the spare
    starts from its kept spec."""
    from agent.host import procs
    from agent.judge.judge import Judge
    from agent.rules.judge import event
    from agent.store.tcpstore import listen_socket
    run_root = str(tmp_path / "run")
    jdir = os.path.join(run_root, "judge")
    os.makedirs(jdir)
    stopped_after.append(run_root)  # stops the spare's supervisor (no judge process to stop)
    judge = Judge({"token": TOKEN, "nodes": ["node1"], "auto_cordon": True,
                   "spares": ["node2"], "nnodes_min": 1}, jdir)
    sock = listen_socket("127.0.0.1", 0)
    threading.Thread(target=judge.run, args=(sock,), daemon=True).start()
    judge_ref = {"addr": "127.0.0.1", "port": sock.getsockname()[1], "token": TOKEN}
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    node_fence.standby({"run_root": run_root, "node": "node2", "spec": {
        "run_id": "r1", "node": "node2", "cwd": str(tmp_path), "argv": sleeper}})
    # a worker that ignores SIGTERM, on a node with a grace far beyond this test's waits:
    # only the hung node's SIGKILL at once ends it in time
    stubborn = [sys.executable, "-c", "import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"]
    node_ops.start({"run_root": run_root, "node": "node1", "spec": {
        "run_id": "r1", "node": "node1", "cwd": str(tmp_path), "argv": stubborn,
        "grace": 600, "judge": judge_ref}})
    try:
        wait_for_sync(lambda: "node1" in judge.lines, 30, "node1's link to the judge")
        # the launch is recorded once its process is forked; the marker shows once it has
        # exec'd, which on a loaded host can come after the link is up
        worker = wait_for_sync(lambda: procs.run_pids(None, "r1/node1"), 30, "node1's worker")
        wait_for_sync(lambda: ignores_sigterm(worker[0]), 30, "the worker ignoring SIGTERM")
        judge.write(event("cordon proposed", "node1", reason="the verdict names rank 1 (x)"))
        outcome = wait_for_sync(lambda: [e for e in events(run_root) if e["what"] == "surgery"
                                         and e.get("action") == "outcome"], 60, "outcome")[0]
        assert (outcome["outcome"], outcome["left"], outcome["gpu"]) == ("done", [], "no GPU")
        ended = node.node_state(os.path.join(run_root, "node1"))
        assert ended["state"] == "stopped" and not ended["alive"], ended
        assert ended["kill"]["killed"] == worker  # SIGKILLed, not waited for
        assert "--auto-cordon" in ended["cause"]["message"]
        assert not procs.run_pids(None, "r1/node1")
        with pytest.raises(Exception, match="cordoned"):
            node_ops.restart({"run_root": run_root, "node": "node1"})
        assert node.node_state(os.path.join(run_root, "node2"))["alive"]
    finally:
        judge.stop.set()
        for pid in procs.run_pids(None, "r1/node1"):
            os.kill(pid, 9)


def ignores_sigterm(pid: int) -> bool:
    """``pid``'s SigIgn mask (/proc/PID/status) has SIGTERM."""
    with open("/proc/%d/status" % pid) as f:
        mask = next(line.split()[1] for line in f if line.startswith("SigIgn:"))
    return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))
