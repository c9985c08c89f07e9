"""Warm spares (agent/torchrun/spare_gate.py in the launcher's process, agent/surgery/spare_hold.py in its
supervisor, agent/node/ops.py ``start``): a real supervisor, the real hook folder and torch's real
rendezvous api, with a stand-in launcher that asks torch for a rendezvous handler as torchrun
does (no store needed: a test backend). The whole path with real torchrun and a cordon is
tests/spine/test_cordon.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.torchrun import hooks, spare_gate
from agent.wire import judge as judge_wire
from agent.node import folder as node, ops as node_ops
from agent.host import procs
from agent.surgery import spare_hold
from agent.judge.control import start_judge, stop_judge, running_judge
from tests.waits import wait_for_sync

TOKEN = "t0ken-" + "h" * 20

# what torchrun does before its rendezvous, on a backend that needs no store; then it waits
STANDIN = """\
import os, sys, time
import torch.distributed.elastic.rendezvous.api as api
class Handler:
    def get_backend(self):
        return "rankdeck-test"
api.rendezvous_handler_registry.register("rankdeck-test", lambda params: Handler())
print("loaded", flush=True)
api.rendezvous_handler_registry.create_handler(api.RendezvousParameters(
    backend="rankdeck-test", endpoint="", run_id="r", min_nodes=1, max_nodes=1))
print("joined, gate in env: %s" % os.environ.get("RANKDECK_GATE_FD"), flush=True)
time.sleep(float(sys.argv[1]))
"""


def blocked_reading(pid: int, fd: int) -> bool:
    """``pid`` sits in read(2) of ``fd`` (/proc/PID/syscall: number, then arguments)."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            words = f.read().split()
    except OSError:
        return False
    return len(words) > 1 and words[0] == "0" and int(words[1], 16) == fd  # x86-64 read


def probe(tmp_path, env_more: dict, fd: int | None):
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK")}
    env.update(env_more)
    if fd is not None:
        env[spare_gate.VAR] = str(fd)
    hooks.install(str(tmp_path / "node"), env)
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    return subprocess.Popen([sys.executable, str(script), "0"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=() if fd is None else (fd,))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="reads x86-64 syscall numbers")
def test_the_gate_holds_the_launcher_before_its_first_handler_until_the_byte(tmp_path):
    read, write = os.pipe()
    # the flight recorder and the poll switched off: the gate alone puts the hook in
    proc = probe(tmp_path, {"RANKDECK_FLIGHT_RECORDER": "0", "RANKDECK_RDZV_POLL": "0"}, read)
    os.close(read)
    try:
        assert proc.stdout.readline().strip() == "loaded"  # torch imported
        wait_for_sync(lambda: blocked_reading(proc.pid, read), 60, "held on the gate")
        os.write(write, spare_gate.GO)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(write)
        proc.kill()
    assert proc.returncode == 0, err
    # through; the variable was taken out of the environment its workers would inherit
    assert out.strip() == "joined, gate in env: None"


def test_a_gate_whose_writer_is_gone_ends_the_launcher_and_workers_are_never_held(tmp_path):
    read, write = os.pipe()
    os.close(write)  # the supervisor gone without a word
    proc = probe(tmp_path / "a", {}, read)
    os.close(read)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == spare_gate.ABANDONED and "joined" not in out
    assert "supervisor went away while it was held" in err
    read, write = os.pipe()
    proc = probe(tmp_path / "b", {"LOCAL_RANK": "0", "RANK": "0"}, read)
    os.close(read)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 0 and "joined" in out, err


def spec_of(tmp_path, judge=None, seconds=30, **more) -> dict:
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    return dict({"run_id": "r1", "node": "node4", "argv": [sys.executable, str(script),
                                                           str(seconds)],
                 "cwd": str(tmp_path), "env": {"RANKDECK_FLIGHT_RECORDER": "0"}, "grace": 2,
                 "judge": judge or {}}, **more)


def args(tmp_path, **more) -> dict:
    return dict(run_root=str(tmp_path / "run"), node="node4", **more)


def log_of(tmp_path) -> str:
    try:
        with open(tmp_path / "run" / "node4" / "torchrun.log") as f:
            return f.read()
    except OSError:
        return ""


@pytest.fixture
def judge(tmp_path):
    """A real judge of a one-node run (node0) on this host; a peer speaks for node0."""
    run_root = str(tmp_path / "judge-run")
    os.makedirs(run_root)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0"],
                                  "stall_after": 60.0})
    node0 = judge_wire.connect_peer("127.0.0.1", info["port"], TOKEN, "node0")
    yield {"addr": "127.0.0.1", "port": info["port"], "token": TOKEN}, node0
    node0.close()
    stop_judge(run_root)
    wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def test_a_held_spare_is_put_in_by_a_start_of_the_same_spec_and_runs_on(tmp_path, judge):
    ref, _node0 = judge
    held = node_ops.start(args(tmp_path, spec=spec_of(tmp_path, ref, hold=True)))
    try:
        assert held["state"] == "held" and held["launches"] == 0 and held["alive"]
        pid = held["torchrun_pid"]
        wait_for_sync(lambda: "loaded" in log_of(tmp_path), 60, "torch imported, held")
        assert "joined" not in log_of(tmp_path)
        # the judge's token is not part of what runs: a later console's spec has none
        put = node_ops.start(args(tmp_path, spec=spec_of(tmp_path, {"addr": ref["addr"],
                                                                "port": ref["port"]})))
        assert (put["state"], put["launches"], put["warm"]) == ("running", 1, True), put
        assert put["torchrun_pid"] == pid  # the held process, not a new one
        wait_for_sync(lambda: "joined, gate in env: None" in log_of(tmp_path), 60,
                      "through the gate")
        with pytest.raises(Exception, match="already running"):
            node_ops.start(args(tmp_path, spec=spec_of(tmp_path, ref)))
    finally:
        done = node_ops.stop(args(tmp_path))
    assert done["left"] == [] and not procs.alive(pid)


def test_a_held_spare_asked_for_another_spec_is_replaced_and_a_stop_leaves_nothing(tmp_path,
                                                                                    judge):
    ref, _node0 = judge
    held = node_ops.start(args(tmp_path, spec=spec_of(tmp_path, ref, hold=True)))
    other = spec_of(tmp_path, ref, seconds=31)  # not what it holds: a cold start instead
    try:
        put = node_ops.start(args(tmp_path, spec=other))
        assert put["state"] == "running" and not put.get("warm")
        assert put["pid"] != held["pid"] and not procs.alive(held["torchrun_pid"])
    finally:
        done = node_ops.stop(args(tmp_path))
    assert done["left"] == []
    # a held spare stopped (`rankdeck stop`, a fence) ends stopped, its torchrun verified gone
    held = node_ops.start(args(tmp_path, spec=spec_of(tmp_path, ref, hold=True)))
    done = node_ops.stop(args(tmp_path))
    assert done["state"] == "stopped" and done["left"] == []
    assert not procs.alive(held["torchrun_pid"])


def test_a_held_spare_ends_with_its_run_and_a_run_without_judge_gets_none(tmp_path, judge):
    ref, node0 = judge
    held = node_ops.start(args(tmp_path, spec=spec_of(tmp_path, ref, hold=True)))
    node0.send({"t": "state", "state": {"state": "exited", "exit_code": 0}})  # the run is over
    ended = wait_for_sync(lambda: (lambda st: st if not st["alive"] else None)(
        node.node_state(node.node_dir(args(tmp_path)))), 60, "the held spare ended")
    assert ended["state"] == "stopped", ended
    assert "the run is over" in ended["cause"]["message"]
    assert not procs.alive(held["torchrun_pid"])
    assert procs.run_pids(None, procs.run_marker("r1", "node4")) == []
    nojudge = tmp_path / "nojudge"
    nojudge.mkdir()
    node_ops.start(args(nojudge, spec=spec_of(nojudge, None, hold=True)))
    ended = wait_for_sync(lambda: (lambda st: st if not st["alive"] else None)(
        node.node_state(node.node_dir(args(nojudge)))), 60, "ended at once")
    assert "no judge" in ended["cause"]["message"]


def test_a_put_in_matches_the_held_spec_but_for_the_judge_and_the_secrets_a_shell_reads_again():
    """What decides warm or cold (agent/surgery/spare_hold.py ``digest``): a later console's spec has
    no judge token, and reads the secrets again from its own shell (another value, or none);
    any other change (a plain env value, the argv) is another process: named, by part."""
    held = {"run_id": "r1", "argv": ["torchrun", "--nnodes", "4"], "judge": {"token": "x"},
            "env": {"A": "1", "TOKEN": "s3cret"}, "secret_env": ["TOKEN"],
            "secret_parts": ["s3cret"], "hold": True}
    kept = spare_hold.digest(held)
    assert "s3cret" not in repr(kept) and "env.TOKEN" not in kept
    for later in ({"env": {"A": "1"}, "secret_env": [], "secret_parts": []},
                  {"env": {"A": "1", "TOKEN": "other"}, "judge": {}}):
        asked = dict(held, **later)
        asked.pop("hold")
        assert spare_hold.differences(kept, spare_hold.digest(
            asked, secret=spare_hold.secret_names(held))) == []
    asked = dict(held, env={"A": "2", "TOKEN": "s3cret"}, argv=["torchrun", "--nnodes", "3"])
    assert spare_hold.differences(kept, spare_hold.digest(asked)) == ["argv", "env.A"]
