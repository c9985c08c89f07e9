"""Checkpoints the trainer deleted, and worker failures torchrun reports (issue 15), on real
files and torchrun's own line."""

from __future__ import annotations

import os
import shutil

from agent.formats.ckpt_watch import CheckpointWatch
from agent.torchrun.worker_exit import failures


def test_a_deleted_checkpoint_is_reported_once_and_a_not_yet_written_one_never(tmp_path):
    (tmp_path / "out" / "checkpoint-10").mkdir(parents=True)
    (tmp_path / "abs.pt").write_bytes(b"x")
    watch = CheckpointWatch(str(tmp_path), every=0.0)
    watch.add({"k": "ckpt", "f": 3, "step": 10, "path": "out/checkpoint-10"})  # relative: cwd
    watch.add({"k": "ckpt", "f": 3, "step": 20, "path": "out/checkpoint-20"})  # not there yet
    watch.add({"k": "ckpt", "f": 3, "step": 5, "path": str(tmp_path / "abs.pt")})
    assert watch.gone() == []
    shutil.rmtree(str(tmp_path / "out" / "checkpoint-10"))
    os.unlink(str(tmp_path / "abs.pt"))
    gone = watch.gone()
    assert sorted((g["k"], g["f"], g["step"], g["path"]) for g in gone) == [
        ("ckpt_gone", 3, 5, str(tmp_path / "abs.pt")),
        ("ckpt_gone", 3, 10, "out/checkpoint-10")]
    assert all(isinstance(g["ts"], float) for g in gone)
    assert watch.gone() == []  # once
    (tmp_path / "out" / "checkpoint-20").mkdir()  # Hugging Face writes it after its line
    assert watch.gone() == []
    shutil.rmtree(str(tmp_path / "out" / "checkpoint-20"))
    assert [g["step"] for g in watch.gone()] == [20]


def test_the_disk_is_looked_at_only_every_so_often(tmp_path):
    (tmp_path / "c.pt").write_bytes(b"x")
    watch = CheckpointWatch(str(tmp_path), every=3600.0)
    watch.add({"k": "ckpt", "step": 1, "path": "c.pt"})
    assert watch.gone() == []
    os.unlink(str(tmp_path / "c.pt"))
    assert watch.gone() == []  # not yet time to look
    assert [g["step"] for g in watch.gone(force=True)] == [1]  # the supervisor's last look


def test_torchruns_worker_failure_line():
    line = ("E1123 13:46:04.111000 18546 .venv/lib/python3.11/site-packages/torch/distributed/"
            "elastic/multiprocessing/api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: "
            "18594) of binary: /work/main/.venv/bin/python\n")
    assert failures("noise\n" + line + "more\n") == [(-6, 0, 18594)]
    assert failures("step=3 failed (exitcode: x)") == []
