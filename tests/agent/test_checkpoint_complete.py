"""Is a save complete? The agent's CheckpointWatch on real checkpoint files written slowly: a
Hugging Face style folder file by file, a torch.save file chunk by chunk. After every write
the watcher looks twice (nothing grew in between, as when a writer stalls): a save is never
called complete before its last byte, and is once it is whole."""

from __future__ import annotations

import io
import json
import os

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from agent.formats.ckpt_watch import CheckpointWatch  # noqa: E402

CHUNK = 4096


def torch_save_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def hf_checkpoint_files() -> list[tuple[str, bytes]]:
    """The files of a Hugging Face Trainer checkpoint, in the order the Trainer writes them
    (weights and config, optimizer and scheduler, RNG state, trainer_state.json last)."""
    gen = torch.Generator().manual_seed(0)
    weights = {"linear.weight": torch.randn(64, 64, generator=gen),
               "linear.bias": torch.randn(64, generator=gen)}
    return [
        ("model.safetensors", safetensors_torch.save(weights)),
        ("config.json", json.dumps({"model_type": "mlp", "hidden_size": 64}).encode()),
        ("optimizer.pt", torch_save_bytes({"state": {0: {"exp_avg": torch.zeros(64, 64)}}})),
        ("scheduler.pt", torch_save_bytes({"last_epoch": 10})),
        ("rng_state.pth", torch_save_bytes({"python": 1, "cpu": torch.get_rng_state()})),
        ("trainer_state.json", json.dumps({"global_step": 10, "log_history": [
            {"loss": 1.5, "step": 10}] * 20}, indent=2).encode()),
    ]


def write_slowly(path: str, data: bytes, watch: CheckpointWatch, seen: list) -> None:
    """Appends ``data`` chunk by chunk; after each chunk the watcher looks twice."""
    with open(path, "ab") as f:
        for start in range(0, len(data), CHUNK):
            f.write(data[start:start + CHUNK])
            f.flush()
            seen.extend(watch.poll())
            seen.extend(watch.poll())


def done(records: list) -> list:
    return [r for r in records if r["k"] == "ckpt_done"]


def test_a_hugging_face_folder_is_complete_only_after_its_last_file(tmp_path):
    watch = CheckpointWatch(str(tmp_path), settle=0.0)
    watch.add({"k": "ckpt", "f": 3, "step": 10, "path": "out/checkpoint-10", "ts": 1.0})
    folder = tmp_path / "out" / "checkpoint-10"
    folder.mkdir(parents=True)
    seen: list = []
    files = hf_checkpoint_files()
    *first, (last_name, last_data) = files
    for name, data in first + [(last_name, last_data[:-1])]:
        write_slowly(str(folder / name), data, watch, seen)
        assert done(seen) == [], "complete before %s was whole" % name
    write_slowly(str(folder / last_name), last_data[-1:], watch, seen)
    [rec] = done(seen)
    assert rec["complete"] is True and rec["step"] == 10 and rec["f"] == 3
    assert rec["path"] == "out/checkpoint-10"
    assert rec["bytes"] == sum(len(data) for _, data in files)
    assert rec["seconds"] > 0  # from the announcement to the last write
    assert done(watch.poll()) == []  # once


def test_a_folder_lacking_a_file_the_last_complete_one_had_is_incomplete(tmp_path):
    """Nothing in the folder names its optimizer state: the previous save does."""
    watch = CheckpointWatch(str(tmp_path), settle=0.0)
    seen: list = []
    for step in (10, 20):
        folder = tmp_path / ("checkpoint-%d" % step)
        folder.mkdir()
        watch.add({"k": "ckpt", "step": step, "path": str(folder), "ts": 1.0})
        for name, data in hf_checkpoint_files():
            if step == 20 and name == "optimizer.pt":
                continue  # the writer died before its optimizer state
            (folder / name).write_bytes(data)
        seen.extend(watch.poll())
        seen.extend(watch.poll())
    seen.extend(watch.poll(final=True))
    results = {r["step"]: r for r in done(seen)}
    assert results[10]["complete"] is True
    assert results[20]["complete"] is False
    assert results[20]["missing"] == ["optimizer.pt"]


def test_a_torch_save_file_is_complete_only_after_its_last_byte(tmp_path):
    data = torch_save_bytes({"model": {"w": torch.randn(128, 128,
                                                          generator=torch.Generator().manual_seed(1))},
                             "step": 50})
    assert len(data) > 10 * CHUNK
    path = tmp_path / "ckpt" / "step_00000050.pt"
    path.parent.mkdir()
    watch = CheckpointWatch(str(tmp_path), settle=0.0)
    watch.add({"k": "ckpt", "f": 1, "step": 50, "path": "ckpt/step_00000050.pt", "ts": 1.0})
    seen: list = []
    write_slowly(str(path), data[:-1], watch, seen)
    assert done(seen) == []
    write_slowly(str(path), data[-1:], watch, seen)
    [rec] = done(seen)
    assert rec["complete"] is True and rec["bytes"] == len(data)
    assert torch.load(str(path), weights_only=True)["step"] == 50


def test_a_torch_save_file_cut_short_stays_incomplete_to_the_end(tmp_path):
    data = torch_save_bytes({"w": torch.zeros(64, 64)})
    path = tmp_path / "last.pt"
    path.write_bytes(data[:len(data) // 2])
    watch = CheckpointWatch(str(tmp_path), settle=0.0)
    watch.add({"k": "ckpt", "step": 7, "path": "last.pt", "ts": 1.0})
    assert done(watch.poll() + watch.poll()) == []
    [rec] = done(watch.poll(final=True))
    assert rec["complete"] is False and rec["missing"] == ["last.pt (cut short)"]


def test_the_checkpoint_dir_watch_announces_new_saves_only(tmp_path):
    ckpts = tmp_path / "ckpts"
    (ckpts / "checkpoint-5").mkdir(parents=True)  # from an earlier run: not this run's save
    watch = CheckpointWatch(str(tmp_path), settle=0.0, watch_dir="ckpts")
    assert watch.poll() == []
    (ckpts / "checkpoint-10").mkdir()
    (ckpts / ".tmp-step_00000020.pt.host.1").write_bytes(b"x")  # a save in the making
    announced = [r for r in watch.poll() if r["k"] == "ckpt"]
    assert [(r["step"], r["path"], r["watch"], r["f"]) for r in announced] == [
        (10, str(ckpts / "checkpoint-10"), True, None)]
    assert [r for r in watch.poll() if r["k"] == "ckpt"] == []  # once
    for name, data in hf_checkpoint_files():
        (ckpts / "checkpoint-10" / name).write_bytes(data)
    [rec] = done(watch.poll() + watch.poll())
    assert rec["complete"] is True and rec["step"] == 10
    assert os.path.isdir(rec["path"])


def test_resume_lines_of_the_reference_trainer_hugging_face_and_lightning():
    from agent.formats.resumed import resumed_records

    assert resumed_records("resumed step=50 from=/abs/ckpt/step_00000050.pt\n") == [
        {"k": "resumed", "step": 50, "path": "/abs/ckpt/step_00000050.pt"}]
    # transformers 5 trainer.py (log_level="info"): the path, then the step, on two lines
    hf = ("[INFO|trainer.py:3659] 2026-11-23 10:00:00,000 >> Loading model from "
          "out/checkpoint-500.\n"
          "[INFO|trainer.py:1632] 2026-11-23 10:00:01,000 >>   Resuming training from "
          "checkpoint with epoch 1 and global step 500\n")
    assert resumed_records(hf) == [{"k": "resumed", "step": 500, "path": "out/checkpoint-500"},
                                   {"k": "resumed", "step": 500, "path": None}]
    assert resumed_records("  Continuing training from global step 7\n") == [
        {"k": "resumed", "step": 7, "path": None}]  # transformers 4.x
    assert resumed_records("Restored all states from the checkpoint at "
                           "/ckpt/epoch=2-step=25.ckpt\n") == [
        {"k": "resumed", "step": 25, "path": "/ckpt/epoch=2-step=25.ckpt"}]
    assert resumed_records("step=3 loss=1.0 resumed later\n") == []
