"""A script that resumes a Hugging Face Trainer and says so (``Resuming from checkpoint
.../checkpoint-150``, the line issue 41's run printed): the agent's parser reads it
(agent/formats/resumed.py) and ``status --json`` lists it in ``resumed_from``, where it was
empty."""

from __future__ import annotations

from agent.formats.resumed import resumed_records
from agent.host.journal import JournalWriter
from console.model.state import RunState

from test_export import replay_journal  # tests/unit is on sys.path (no package)

LINE = "[INFO] Resuming from checkpoint /data/run7/out/checkpoint-150\n"


def test_the_line_is_a_resume_of_its_step_and_path():
    assert resumed_records(LINE) == [
        {"k": "resumed", "step": 150, "path": "/data/run7/out/checkpoint-150"}]
    assert resumed_records("Resuming from checkpoint out/checkpoint-20.\n") == [
        {"k": "resumed", "step": 20, "path": "out/checkpoint-20"}]
    # the Trainer's own line is another pattern's, read once
    assert resumed_records("Resuming training from checkpoint with epoch 1 and global step "
                           "500\n") == [{"k": "resumed", "step": 500, "path": None}]


def test_status_json_lists_it_in_resumed_from(tmp_path):
    path = str(tmp_path / "journal")
    w = JournalWriter(path)
    w.append({"k": "file", "f": 1, "rank": 0, "local_rank": 0, "stream": "stderr",
              "attempt": 0, "instance": "i1", "path": "x/0/stderr.log"})
    for rec in resumed_records(LINE):
        w.append(dict(rec, f=1, ts=1000.0))
    w.close()
    state = RunState("run9", [("node0", "10.0.0.1")])
    replay_journal(state, "node0", path)
    assert state.status()["resumed_from"] == [{
        "node": "node0", "rank": 0, "step": 150, "path": "/data/run7/out/checkpoint-150",
        "ts": 1000.0}]
