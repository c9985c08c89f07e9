"""A torchrun's phase from its own record lines, captured from real torchruns (torch 2.13,
c10d rendezvous on a standalone store, 2 nodes x 1 worker, the bootstrap of
agent/torchrun/log.py): ``first-node.log`` waited for its peer, ``survivor.log`` lost its peer
(killed with SIGKILL) and restarted its workers twice, ``relaunched.log`` is the killed node's
new torchrun, which finished while the survivor waited for it in round 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.torchrun.log import TorchrunLog, with_rank_record
from agent.torchrun.phase import PhaseTracker

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_phase")


def phases(name: str) -> list[tuple]:
    """Every phase a record file goes through: (name, round, note, since)."""
    tracker = PhaseTracker(now=0.0)
    seen = []
    with open(os.path.join(HERE, name)) as f:
        for line in f.read().splitlines():
            if tracker.feed(line):
                p = tracker.phase
                seen.append((p["name"], p["round"], p["note"], p["since"]))
    return seen


def test_a_first_node_waits_then_runs_its_workers():
    seen = phases("first-node.log")
    assert [(n, r, note) for n, r, note, _ in seen] == [
        ("rendezvous", None, "joining"),
        ("rendezvous", 0, "waiting"),  # alone in round 0 for 7 s: its peer came later
        ("assigning ranks", 0, None),
        ("starting workers", 0, None),
        ("workers running", 0, None),
    ]
    assert seen[1][3] == 1795441330.266  # since: torchrun's own time of the record
    tracker = PhaseTracker()
    for line in open(os.path.join(HERE, "first-node.log")).read().splitlines()[:4]:
        tracker.feed(line)
    assert tracker.phase["rank"] == 0 and tracker.phase["world"] == 2


def test_a_survivor_restarts_its_workers_and_waits_for_the_lost_peer():
    seen = phases("survivor.log")
    names = [(n, r, note) for n, r, note, _ in seen]
    assert ("restarting workers", 0, "worker group failed, 3/3 restarts left") in names
    assert ("rendezvous", 1, "wait list") in names  # round 0 was full: it waits for round 1
    assert ("rendezvous", 1, "dropped dead node 127.0.0.2_14866_0") in names
    # where it ends: a participant of round 2, waiting for a peer that never comes
    assert names[-1] == ("rendezvous", 2, "waiting")
    # a dead node noted keeps the time the wait began
    dropped = [s for n, r, note, s in seen if note and note.startswith("dropped dead node")]
    waited = [s for n, r, note, s in seen if note == "wait list"]
    assert dropped[0] == waited[0]


def test_a_node_whose_workers_finished_waits_for_the_others():
    seen = phases("relaunched.log")
    assert seen[-1][:3] == ("finished", 1, None)


def test_lines_it_does_not_know_change_nothing():
    tracker = PhaseTracker(now=5.0)
    assert not tracker.feed("  restart_count=0")
    assert not tracker.feed("1795441330.1 [default] something torch added later")
    assert not tracker.feed("not a record")
    assert tracker.phase == {"name": "starting", "round": None, "note": None, "since": 5.0}
    tracker.end(9.0, "exit 1")
    assert tracker.phase["name"] == "ended" and tracker.phase["note"] == "exit 1"


@pytest.mark.e2e
def test_a_real_torchrun_records_its_phases(tmp_path):
    """The bootstrap writes the phase lines (and torchrun's console shows none of them)."""
    pytest.importorskip("torch")
    script = tmp_path / "quick.py"
    script.write_text("print('hello')\n")
    record = str(tmp_path / "ranks.log")
    argv = with_rank_record([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "1", "--log-dir", str(tmp_path / "logs"),
                             "--redirects", "3", str(script)], record)
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240,
                         cwd=str(tmp_path), env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert out.returncode == 0, out.stdout
    log = TorchrunLog(str(tmp_path / "console.log"), record)
    # its workers ran and finished; then the last node out closed the rendezvous
    assert log.current_phase()["name"] == "closed"
    assert "Starting worker group" in open(record).read()
    assert log.rank_of(0, 0) == (0, 1)
    assert b"Rendezvous'ing" not in out.stdout and b"joined round" not in out.stdout
