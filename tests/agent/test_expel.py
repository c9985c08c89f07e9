"""A fenced node's dead torchrun taken out of the c10d rendezvous on its behalf
(agent/surgery/expel.py): real torch rendezvous handlers on rankdeck's real store process, with a
keep-alive of 60 s x 3, so without the expel the killed node's entry would hold the
survivors' next round for three minutes."""

from __future__ import annotations

import base64
import os
import pickle
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from agent.surgery import expel
from agent.host import procs
from agent.host.runfiles import write_json_atomic
from agent.store.tcpstore import start_store, stop_store
from tests.spine.helpers import HOST_PYTHON
from tests.waits import wait_for_sync

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMBER = os.path.join(REPO, "tests", "agent", "expel", "member.py")
FLAGS = ["--rdzv-backend", "c10d", "--rdzv-id", "run-x"]


def keep_store_up(run_root):
    """A live node of the run on this host (this test process as its supervisor): the store
    stops itself only once the run has ended here (agent/store/tcpstore.py wait_for_run_end)."""
    me = procs.stat(os.getpid())
    write_json_atomic(os.path.join(run_root, "node0", "state.json"),
                      {"pid": me.pid, "starttime": me.starttime, "state": "running"})


def cmdline(pid):
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        return f.read()


def member(endpoint, *more, stdin=None):
    # no bootstrap TCPStore of rank 0's own: these nodes run no workers
    env = dict(os.environ, PYTHONPATH=REPO, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return subprocess.Popen([HOST_PYTHON, MEMBER, endpoint] + FLAGS + list(more), env=env,
                            stdin=stdin, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def store(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(os.path.join(run_root, "node0"))
    keep_store_up(run_root)
    info = start_store(run_root, "127.0.0.1", HOST_PYTHON)
    yield run_root, "127.0.0.1:%d" % info["port"]
    stop_store(run_root)


def test_a_killed_node_is_expelled_and_the_survivors_next_round_completes(store):
    run_root, endpoint = store
    a = member(endpoint, "--local-addr", "127.0.0.2")
    b = member(endpoint, "--local-addr", "127.0.0.3", "--spare", "127.0.0.4", stdin=subprocess.PIPE)
    try:
        assert a.stdout.readline() == "joined\n" and b.stdout.readline() == "joined\n"
        who = expel.member(a.pid)  # as a fence reads its torchrun, before the kill
        assert who == {"pid": a.pid, "addr": "127.0.0.2", "rdzv_ids": ["run-x"]}
        a.kill()
        a.wait()
        b.stdin.write("again\n")  # b joins again beside the spare, as after a failure
        b.stdin.flush()
        # the dead node's pid at another address: not its entry, nothing is touched
        other = expel.answer(run_root, expel.ask(run_root, dict(who, addr="127.0.0.3")), 30)
        assert other["expelled"] is False and other["gone"] is False and other["why"].startswith(
            "no entry for 127.0.0.3 pid %d: that pid is in it as " % a.pid), other
        done = expel.answer(run_root, expel.ask(run_root, who), 30)
        assert done == {"expelled": True, "why": "", "rdzv_id": "run-x"}
        # the survivor and the spare (live entries, untouched) make the next round at once
        assert b.stdout.readline() == "round 1: 127.0.0.3, 127.0.0.4\n"
        again = expel.answer(run_root, expel.ask(run_root, who), 30)
        assert again["expelled"] is False and again["gone"] is True
        assert "gone already" in again["why"]
        unknown = expel.answer(run_root, expel.ask(run_root, dict(who, rdzv_ids=["nope"])), 30)
        assert unknown == {"expelled": False, "why": "no rendezvous nope in the store",
                           "gone": False}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    with open(os.path.join(run_root, "store.log")) as f:
        assert "expel 127.0.0.2 pid %d: done" % a.pid in f.read()


def test_who_a_torchrun_is_in_the_rendezvous_comes_from_its_command_line():
    code = "import sys; sys.stdin.read()"
    for flags, want in (
            (FLAGS + ["--local-addr", "10.0.0.7"], ("10.0.0.7", ["run-x"])),
            (["--rdzv_backend=c10d", "--rdzv_id=r-job2", "--local_addr=n1"], ("n1", ["r-job2"])),
            (["--rdzv-backend", "static", "--rdzv-id", "r"], None),  # not c10d: no expel
            (["--rdzv-backend", "c10d"], None)):  # no rendezvous id to look in
        p = subprocess.Popen([sys.executable, "-c", code] + flags, stdin=subprocess.PIPE)
        try:
            # Popen returns once exec began; the new command line is set a moment later
            wait_for_sync(lambda: cmdline(p.pid), what="the child's command line")
            got = expel.member(p.pid)
        finally:
            p.communicate(b"")
        assert (got and (got["addr"], got["rdzv_ids"])) == want or got is want is None, flags
    assert expel.member(p.pid) is None  # gone


@pytest.mark.parametrize("bad", [None, {"pid": True, "addr": "a", "rdzv_ids": ["r"]},
                                 {"pid": 5, "addr": "", "rdzv_ids": ["r"]},
                                 {"pid": 5, "addr": "a", "rdzv_ids": "r"},
                                 {"pid": 5, "addr": "a", "rdzv_ids": ["r"] * 9}])
def test_a_member_from_the_wire_is_checked(bad):
    with pytest.raises(ValueError):
        expel.checked(bad)


class Payload:
    """A pickle whose load runs a command (what a client of the store could write there)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, ("touch %s" % self.marker,)


def crafted_states(marker):
    """Pickles a client of the store could leave as the rendezvous state, each of which runs
    code when ``pickle.loads`` reads it: alone, and inside a real-looking state."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousState

    state = _RendezvousState()
    state.last_heartbeats = {"x": Payload(marker)}
    return [pickle.dumps(Payload(marker)), pickle.dumps(state),
            pickle.dumps(Payload(marker), protocol=0)]


def real_state():
    """A rendezvous state as torch's dynamic_rendezvous.py pickles it: its own classes."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc, _RendezvousState)

    a, b, c = _NodeDesc("10.0.0.1", 11, 0), _NodeDesc("10.0.0.2", 12, 0), _NodeDesc("n3", 13, 1)
    state = _RendezvousState()
    state.round, state.complete, state.closed = 3, True, False
    state.deadline = datetime.now(timezone.utc)
    state.participants = {a: 0, b: 1}
    state.wait_list, state.redundancy_list = {c}, set()
    state.last_heartbeats = {a: datetime.now(timezone.utc),
                             b: datetime.now(timezone(timedelta(hours=2))), c: datetime.now()}
    return state


def test_a_real_rendezvous_state_loads_and_a_crafted_one_runs_nothing(tmp_path):
    state = real_state()
    got = expel.load_state(pickle.dumps(state))
    assert type(got) is type(state) and vars(got) == vars(state)
    marker = tmp_path / "ran"
    for data in crafted_states(marker):
        with pytest.raises(pickle.UnpicklingError):
            expel.load_state(data)
    assert not marker.exists()


def test_the_store_refuses_a_crafted_state_and_runs_nothing(store, tmp_path):
    """Any client of the store may write the state; the store process, asked to expel, reads it
    and runs nothing (the store lives on a host where no torchrun would unpickle it)."""
    from torch.distributed import TCPStore

    run_root, endpoint = store
    host, port = endpoint.rsplit(":", 1)
    client = TCPStore(host, int(port), is_master=False, wait_for_workers=False)
    marker = tmp_path / "ran"
    who = {"pid": 4242, "addr": "10.0.0.9", "rdzv_ids": ["run-x"]}
    for data in crafted_states(marker):
        client.set(expel.KEY_PREFIX + "run-x", base64.b64encode(data))
        got = expel.answer(run_root, expel.ask(run_root, who), 30)
        assert got["expelled"] is False and got["why"].startswith(
            "the rendezvous state could not be read"), got
        assert not marker.exists()
    # a real state in the store is still read: no entry of that pid, nothing touched
    client.set(expel.KEY_PREFIX + "run-x", base64.b64encode(pickle.dumps(real_state())))
    got = expel.answer(run_root, expel.ask(run_root, who), 30)
    assert got["why"] == "no entry for 10.0.0.9 pid 4242: " + expel.GONE, got
    with open(os.path.join(run_root, "store.log")) as f:
        assert "could not be read" in f.read()
