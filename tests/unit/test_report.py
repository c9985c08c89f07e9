"""`rankdeck report` and the checkpoints it lists, from a replayed journal.

The journal is written with the agent's JournalWriter (rank files, metrics, checkpoints the
agent found complete or not, resume lines, a failure whose cause is hostile host text with a
secret in it), read back with the agent's JournalReader and fed to RunState through the
protocol's checks, as NodeLink does."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from agent.host.journal import JournalWriter
from console.model.checkpoints import Checkpoints
from console.verbs.cli import build_parser
from console.records.report import RunReport
from console.lines.sanitize import Masker
from console.model.state import RunState

from test_export import replay_journal  # tests/unit is on sys.path (no package)

SECRET = "hunter2-very-secret"
HOSTILE = "boom \x1b[31m<script>alert(1)</script> | [click](http://evil) *x* " + SECRET


def journal(path: str) -> None:
    w = JournalWriter(path)
    for f, rank in ((1, 0), (2, 1)):
        w.append({"k": "file", "f": f, "rank": rank, "local_rank": rank, "stream": "stdout",
                  "attempt": 0, "instance": "i1", "path": "x/%d/stdout.log" % rank})
    for step in range(1, 6):
        for f in (1, 2):
            w.append({"k": "metric", "f": f, "step": step, "loss": 5.0 / step + f,
                      "ts": 1000.0 + step})
    w.append({"k": "ckpt", "f": 1, "step": 2, "path": "/c/checkpoint-2", "ts": 1002.0})
    w.append({"k": "ckpt", "f": None, "step": 2, "path": "/c/checkpoint-2", "watch": True,
              "ts": 1002.5})  # the --checkpoint-dir watch saw the same save
    w.append({"k": "ckpt_done", "f": 1, "step": 2, "path": "/c/checkpoint-2", "ts": 1003.0,
              "complete": True, "bytes": 3 << 20, "seconds": 1.5})
    w.append({"k": "ckpt", "f": 1, "step": 4, "path": "/c/checkpoint-4", "ts": 1004.0})
    w.append({"k": "ckpt_done", "f": 1, "step": 4, "path": "/c/checkpoint-4", "ts": 1005.0,
              "complete": False, "bytes": 100, "seconds": None, "missing": ["optimizer.pt"]})
    w.append({"k": "event", "what": "restarting", "ts": 1006.0, "node": "node0"})
    for f in (1, 2):  # every rank prints its resume line
        w.append({"k": "resumed", "f": f, "step": 2, "path": "/c/checkpoint-2", "ts": 1007.0})
    w.append({"k": "event", "what": "ended", "state": "failed", "exit_code": 1, "ts": 1008.0,
              "node": "node0", "cause": {"message": HOSTILE, "rank": 1}})
    w.close()


def replayed(tmp_path) -> RunState:
    path = str(tmp_path / "journal")
    journal(path)
    state = RunState("run9", [("node0", "10.0.0.1")])
    state.masker = Masker([SECRET])
    replay_journal(state, "node0", path)
    return state


def test_status_json_says_complete_last_complete_and_resumed_from(tmp_path):
    status = replayed(tmp_path).status()
    [first, second] = status["checkpoints"]
    assert (first["step"], first["complete"], first["seconds"], first["last_complete"]) == (
        2, True, 1.5, True)
    assert first["rank"] == 0  # the trainer's line; the folder watch added nothing
    assert (second["complete"], second["missing"], second["last_complete"]) == (
        False, ["optimizer.pt"], False)
    assert status["resumed_from"] == [{"node": "node0", "rank": 0, "step": 2,
                                       "path": "/c/checkpoint-2", "ts": 1007.0}]


def test_events_say_each_save_and_resume_once(tmp_path):
    state = replayed(tmp_path)
    texts = [(ev.kind, ev.text) for ev in state.events
             if ev.kind.startswith("checkpoint") or ev.kind == "resumed"]
    assert texts == [
        ("checkpoint", "checkpoint step 2 saved: /c/checkpoint-2"),
        ("checkpoint complete", "checkpoint step 2 complete: 3.0 MiB in 1.5 s"),
        ("checkpoint", "checkpoint step 4 saved: /c/checkpoint-4"),
        ("checkpoint incomplete", "checkpoint step 4 incomplete: /c/checkpoint-4 lacks "
                                  "optimizer.pt"),
        ("resumed", "ranks resumed from checkpoint step 2: /c/checkpoint-2")]


def test_hugging_faces_two_resume_lines_make_one_resume_point():
    ckpts = Checkpoints()
    ckpts.saved("n", 0, {"step": 500, "path": "out/checkpoint-500"})
    got = ckpts.resume("n", 0, {"path": "out/checkpoint-500", "step": 500})
    assert (got.step, got.path) == (500, "out/checkpoint-500")
    assert ckpts.resume("n", 0, {"step": 500}) is None  # "... global step 500": the same load
    got = ckpts.resume("n", 1, {"step": 900})  # a later restart, step only: found by its step
    assert (got.step, got.path) == (900, None)


def test_the_report_has_every_section_and_no_host_text_escapes(tmp_path):
    md_path, svg_path = RunReport(replayed(tmp_path)).write(str(tmp_path / "out"))
    md = open(md_path, encoding="utf-8").read()
    for heading in ("# Run run9", "## Nodes", "## Loss", "## Checkpoints",
                    "## Restarts, stalls and verdicts"):
        assert heading in md
    assert "![loss by step, one line per rank](run9-loss.svg)" in md
    assert "**last complete** 2" in md
    assert "incomplete: lacks optimizer.pt" in md
    assert "node0 resumed from step 2: /c/checkpoint-2" in md
    assert re.search(r"\| node0 \| failed \| 0 \| 5 \|", md)
    assert SECRET not in md and "\x1b" not in md
    assert "<script>" not in md and "](http" not in md
    failed = [line for line in md.splitlines() if "| failed |" in line and "boom" in line]
    assert len(failed) == 1 and failed[0].count(" | ") == 4  # the host's "|" is escaped


def test_the_loss_svg_draws_one_line_per_rank(tmp_path):
    _, svg_path = RunReport(replayed(tmp_path)).write(str(tmp_path))
    root = ET.parse(svg_path).getroot()
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert [line.find("{http://www.w3.org/2000/svg}title").text for line in lines] == [
        "rank 0", "rank 1"]
    points = [[tuple(map(float, p.split(","))) for p in line.get("points").split()]
              for line in lines]
    assert all(len(p) == 5 for p in points)
    assert points[0][0][1] < points[0][-1][1]  # loss falls: the line goes down the page...
    assert points[1][0][1] < points[0][0][1]  # ...and rank 1's loss (higher) is drawn above


def test_cli_knows_report():
    args = build_parser().parse_args(["report", "run9", "--out", "/tmp/x"])
    assert (args.cmd, args.run_id, args.out) == ("report", "run9", "/tmp/x")


def test_the_status_table_names_the_last_complete_save_and_the_resume(tmp_path):
    from console.model.summary import status_table

    table = status_table(replayed(tmp_path).status())
    assert ("checkpoints: 2 saved; newest step 4 at /c/checkpoint-4 (node0); last complete "
            "step 2 at /c/checkpoint-2") in table
    assert "  node0 resumed from step 2: /c/checkpoint-2" in table
