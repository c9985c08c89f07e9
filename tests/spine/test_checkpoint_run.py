"""`launch --checkpoint-dir`: a trainer that prints nothing when it saves, on a real local node.

The script (real torchrun, one node) writes a torch.save file chunk by chunk and then a Hugging
Face style folder file by file into the watched folder, slowly, printing nothing about either;
then it prints the reference trainer's resume line. The node's supervisor finds both saves,
judges them complete only once whole, and the console's status says so, which one is the last
complete, and what the ranks resumed from.
"""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

from console.verbs.cli import build_parser
from console.verbs.recorded import cmd_report
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from tests.waits import wait_for

from .helpers import local_inventory, wind_down

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 240

SLOW_SAVER = """\
import io, json, os, sys, time
import torch
from safetensors.torch import save as save_safetensors

def slowly(path, data, chunks=8):
    with open(path, "wb") as f:
        for i in range(chunks):
            f.write(data[i * len(data) // chunks:(i + 1) * len(data) // chunks])
            f.flush()
            time.sleep(0.3)

def torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()

os.makedirs("ckpts", exist_ok=True)
slowly("ckpts/step_00000010.pt", torch_bytes({"w": torch.randn(256, 256), "step": 10}))
folder = "ckpts/checkpoint-20"
os.makedirs(folder)
slowly(folder + "/model.safetensors", save_safetensors({"w": torch.randn(256, 256)}))
slowly(folder + "/config.json", json.dumps({"hidden_size": 256}).encode(), chunks=2)
slowly(folder + "/optimizer.pt", torch_bytes({"state": {0: torch.zeros(256, 256)}}))
slowly(folder + "/trainer_state.json", json.dumps({"global_step": 20}).encode(), chunks=2)
while not os.path.exists("seen"):  # the test saw checkpoint-20 found complete: go on
    time.sleep(0.1)
print("resumed step=10 from=" + os.path.abspath("ckpts/step_00000010.pt"), flush=True)
"""


@pytest.fixture
async def controller(tmp_path):
    ctl = RunController(local_inventory(tmp_path / "work", n=1), LocalTransport(), History())
    yield ctl
    assert not await wind_down(ctl), "processes left behind"


async def test_saves_in_the_watched_folder_are_found_complete_and_the_resume_named(
        controller, tmp_path):
    ctl = controller
    work = tmp_path / "work"
    (work / "ckpts" / "checkpoint-5").mkdir(parents=True)  # an earlier run's: not this run's
    script = tmp_path / "slow_saver.py"
    script.write_text(textwrap.dedent(SLOW_SAVER))
    await ctl.launch(LaunchSpec(script=str(script), nproc_per_node=1, max_restarts=0,
                                checkpoint_dir="ckpts"), preflight=False)
    # the watch looks every second: the trainer lives on until it has seen the last save stay
    # as it is (a trainer that exits at once may leave its last save unconfirmed)
    await wait_for(lambda: any(e.kind == "checkpoint complete" and "step 20 complete" in e.text
                               for e in ctl.state.events), RUN_TIMEOUT,
                   lambda: "checkpoint-20 found complete; events: %s" % [
                       (e.kind, e.text) for e in ctl.state.events])
    (work / "seen").touch()
    final = await asyncio.wait_for(ctl.wait_done(), RUN_TIMEOUT)
    await ctl.stop_store()
    status = ctl.state.status()
    assert final == "succeeded", status
    saves = [(c["step"], c["path"], c["watched"], c["complete"], c["last_complete"])
             for c in status["checkpoints"]]
    assert saves == [
        (10, str(work / "ckpts" / "step_00000010.pt"), True, True, False),
        (20, str(work / "ckpts" / "checkpoint-20"), True, True, True)], status["checkpoints"]
    pt, folder = status["checkpoints"]
    assert pt["bytes"] == os.path.getsize(pt["path"])
    assert folder["bytes"] == sum(os.path.getsize(os.path.join(folder["path"], name))
                                  for name in os.listdir(folder["path"]))
    assert all(c["seconds"] is not None and c["seconds"] > 0 for c in (pt, folder))
    # complete was said only after the last write: never while a file still grew
    done_at = {c["step"]: e.ts for e in ctl.state.events for c in (pt, folder)
               if e.kind == "checkpoint complete" and "step %d complete" % c["step"] in e.text}
    assert done_at[10] >= os.path.getmtime(pt["path"])
    assert done_at[20] >= os.path.getmtime(os.path.join(folder["path"], "trainer_state.json"))
    [resumed] = status["resumed_from"]
    assert (resumed["node"], resumed["step"], resumed["path"]) == ("node0", 10, pt["path"])

    # `rankdeck report RUN` from the recorded run: its journals replayed afresh
    args = build_parser().parse_args(["report", ctl.run_id, "--out", str(tmp_path / "rep")])
    assert await cmd_report(args) == 0
    md = (tmp_path / "rep" / ("%s-report.md" % ctl.run_id)).read_text()
    assert "| **last complete** 20 | node0 |" in md
    assert "node0 resumed from step 10: %s" % pt["path"].replace("_", "\\_") in md
    assert (tmp_path / "rep" / ("%s-loss.svg" % ctl.run_id)).exists()
