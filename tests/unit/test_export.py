"""`rankdeck export`: rank metrics and node telemetry from a replayed journal, as JSONL and CSV.

The journal is a real one: the agent's JournalWriter with metric records and the
supervisor's TelemetryRecorder sampling this machine, read back with the agent's
JournalReader and fed to RunState as NodeLink does.
"""

import csv
import json
import os

import pytest

from agent.wire import protocol
from agent.host.stats import TelemetryRecorder
from agent.host.journal import JournalReader, JournalWriter
from agent.serve.streams import wire
from console.run.messages import parse
from console.verbs.cli import build_parser
from console.records.export import NODE_FIELDS, RANK_FIELDS, RunExport
from console.model.state import RunState


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def journal_of_a_node(path):
    writer = JournalWriter(path)
    writer.append({"k": "file", "f": 1, "rank": 3, "local_rank": 1, "stream": "stdout",
                   "attempt": 0, "instance": "i1", "path": "x/stdout.log"})
    writer.append({"k": "file", "f": 2, "rank": None, "stream": "torchrun"})
    clock = Clock()
    recorder = TelemetryRecorder(writer, os.path.dirname(path), every=10.0, clock=clock)
    recorder.tick()  # primes the rates, records nothing
    for step in (1, 2):
        writer.append({"k": "metric", "f": 1, "step": step, "loss": 4.0 / step, "lr": 3e-4,
                       "step_time": 0.5, "tok_s": 8192.0, "ts": 1000.0 + step})
        clock.now += 10.0
        recorder.tick()
    recorder.tick()  # within the period: nothing
    writer.append({"k": "metric", "f": 2, "step": 9, "ts": 1003.0})  # torchrun's: no rank
    writer.append({"k": "metric", "f": 1, "step": 3, "ts": 1004.0})  # a progress bar moved
    writer.close()


def replay_journal(state: RunState, node: str, path: str) -> None:
    """The journal at ``path`` into ``state`` as NodeLink gets it: serve's wire form, through
    the protocol and its checks."""
    reader = JournalReader(path, 0)
    records = reader.read(1 << 20)
    reader.close()
    msg = parse(protocol.encode({"t": "journal", "end": records[-1][2],
                                 "recs": wire(records)}))
    state.apply_records(node, msg["recs"], msg["end"])


def replayed(tmp_path):
    path = str(tmp_path / "journal")
    journal_of_a_node(path)
    state = RunState("run7", [("node0", "10.0.0.1")])
    export = RunExport(state)
    replay_journal(state, "node0", path)
    return export


def test_jsonl_holds_every_step_of_every_rank_and_the_telemetry(tmp_path):
    export = replayed(tmp_path)
    ranks_path, nodes_path = export.write(str(tmp_path / "out"), "jsonl")
    assert os.path.basename(ranks_path) == "run7-ranks.jsonl"
    ranks = [json.loads(line) for line in open(ranks_path)]
    assert ranks == [
        {"ts": 1001.0, "node": "node0", "rank": 3, "step": 1, "loss": 4.0, "lr": 3e-4,
         "step_time": 0.5, "tok_s": 8192.0},
        {"ts": 1002.0, "node": "node0", "rank": 3, "step": 2, "loss": 2.0, "lr": 3e-4,
         "step_time": 0.5, "tok_s": 8192.0},
        {"ts": 1004.0, "node": "node0", "rank": 3, "step": 3, "loss": None, "lr": None,
         "step_time": None, "tok_s": None},
    ]
    nodes = [json.loads(line) for line in open(nodes_path)]
    assert len(nodes) == 2 and list(nodes[0]) == list(NODE_FIELDS)
    assert all(n["node"] == "node0" and n["mem_total"] > 0 for n in nodes)
    assert all(n["load1"] is not None and n["mem_used"] > 0 for n in nodes)


def test_csv_reads_back_with_the_same_columns(tmp_path):
    export = replayed(tmp_path)
    ranks_path, nodes_path = export.write(str(tmp_path / "out"), "csv")
    with open(ranks_path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(RANK_FIELDS)
    assert rows[1] == ["1001.0", "node0", "3", "1", "4.0", "0.0003", "0.5", "8192.0"]
    assert rows[3][4:] == ["", "", "", ""]  # what the trainer did not print is empty
    with open(nodes_path, newline="") as f:
        nodes = list(csv.DictReader(f))
    assert len(nodes) == 2 and int(nodes[0]["mem_total"]) > 0


def test_host_text_cannot_become_a_spreadsheet_formula(tmp_path):
    state = RunState("run8", [("node0", "10.0.0.1")])
    export = RunExport(state)
    host = {"net": [{"iface": "=HYPERLINK(\"http://x\")", "up": False}]}
    state.apply_records("node0", [[{"k": "telemetry", "ts": 5.0, "host": host, "j": 0}]], 10)
    _ranks, nodes_path = export.write(str(tmp_path), "csv")
    with open(nodes_path, newline="") as f:
        row = list(csv.DictReader(f))[0]
    assert row["links_down"] == "HYPERLINKhttp://x"


def test_cli_knows_export_and_refuses_an_unknown_format(capsys):
    args = build_parser().parse_args(["export", "R", "--format", "csv", "--out", "d"])
    assert (args.cmd, args.run_id, args.format, args.out) == ("export", "R", "csv", "d")
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["export", "R", "--format", "parquet"])
    assert exc.value.code == 2
    assert "invalid choice: 'parquet'" in capsys.readouterr().err


def test_tensorboard_event_files_read_back_with_tensorboards_own_reader(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    export = replayed(tmp_path)
    paths = export.write(str(tmp_path / "tb"), "tensorboard")
    assert sorted(os.path.basename(os.path.dirname(p)) for p in paths) == ["node0", "rank3"]
    rank = EventAccumulator(str(tmp_path / "tb" / "run7" / "rank3"))
    rank.Reload()
    assert sorted(rank.Tags()["scalars"]) == ["loss", "lr", "step_time", "tok_s"]
    assert [(e.step, e.value, e.wall_time) for e in rank.Scalars("loss")] == [
        (1, 4.0, 1001.0), (2, 2.0, 1002.0)]  # step 3 printed no loss
    assert [e.step for e in rank.Scalars("tok_s")] == [1, 2]
    node = EventAccumulator(str(tmp_path / "tb" / "run7" / "node0"))
    node.Reload()
    mem = node.Scalars("telemetry/mem_used")
    assert [e.step for e in mem] == [0, 1] and all(e.value > 0 for e in mem)
    assert "telemetry/links_down" not in node.Tags()["scalars"]  # a list, not a number


def test_tensorboard_missing_is_a_usage_error_naming_the_extra(monkeypatch):
    import builtins

    from console.errors import UsageError
    from console.records.export import check_format

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    check_format("csv")
    with pytest.raises(UsageError, match=r"pip install 'rankdeck\[tensorboard\]'"):
        check_format("tensorboard")
