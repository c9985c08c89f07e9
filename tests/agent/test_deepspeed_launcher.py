"""A DeepSpeed node's phase and a failed start's cause, from a real DeepSpeed 0.19 run on CPU
(``deepspeed_crash/``: ``deepspeed.launcher.runner --no_ssh`` on one node of two ranks, the
reference trainer's ds_train.py with ``--crash-at-step 3 --crash-rank 1``; rank 0 then failed
on the lost peer, and the launcher killed both): its console (``torchrun.log``) and each
rank's file (``--enable_each_rank_log``). DeepSpeed has no torchrun records: its phase and
cause come from these (agent/torchrun/phase.py, agent/torchrun/cause.py)."""

from __future__ import annotations

import os
import shutil

from agent.torchrun import cause
from agent.host.tail import rank_files
from agent.torchrun.log import TorchrunLog

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deepspeed_crash")
RANK0, RANK1 = "20261126065638_rank0.log", "20261126065638_rank1.log"


def launcher_text() -> str:
    with open(os.path.join(HERE, "torchrun.log")) as f:
        return f.read()


def test_the_phase_follows_the_launchers_own_lines(tmp_path):
    path = tmp_path / "torchrun.log"
    log = TorchrunLog(str(path), None, "deepspeed")
    log.new_launch(1.0)
    assert log.current_phase()["name"] == "starting"
    lines = launcher_text().splitlines(keepends=True)
    spawned = next(i for i, l in enumerate(lines) if "spawned with command" in l)
    path.write_text("".join(lines[:spawned + 1]))
    assert log.current_phase()["name"] == "workers running"
    path.write_text("".join(lines))
    phase = log.current_phase()
    assert (phase["name"], phase["note"]) == ("stopping", "a rank exited with code 1")
    # under torchrun the same console lines say nothing: its phase comes from its records
    other = TorchrunLog(str(path), None, "torchrun")
    assert other.current_phase()["name"] == "starting"


def test_the_cause_names_the_rank_the_launcher_saw_fail_first():
    paths = rank_files(HERE, os.listdir(HERE))
    assert sorted(paths) == [0, 1]
    # rank 0's file ends with an exception too (its lost peer), and the fixture's files have
    # no meaningful times: the launcher's line names the rank; the secret is masked
    said = cause.rank_file_failed(paths, launcher_text(), ["step 3 on"])
    assert said == {"message": "rank 1: RuntimeError: injected crash at **** rank 1",
                    "rank": 1}


def test_without_the_launchers_line_the_first_file_to_end_with_an_exception(tmp_path):
    for name in (RANK0, RANK1):
        shutil.copy(os.path.join(HERE, name), tmp_path / name)
    # rank 0 failed on its lost peer, after rank 1's crash: its file was written last
    os.utime(tmp_path / RANK1, (1000, 1000))
    os.utime(tmp_path / RANK0, (1001, 1001))
    paths = rank_files(str(tmp_path), [RANK0, RANK1, "unrelated.txt"])
    assert cause.rank_file_failed(paths, "", [])["rank"] == 1
    os.utime(tmp_path / RANK0, (999, 999))
    said = cause.rank_file_failed(paths, "", [])
    assert said["rank"] == 0 and "Connection closed by peer" in said["message"]
    assert cause.rank_file_failed({}, "", []) is None


def test_a_launcher_that_fails_is_named_in_the_cause():
    assert cause.torchrun_failed(1, "", True, [], "deepspeed") == (
        "deepspeed exited with code 1; no worker error file (see the rank logs and "
        "torchrun.log)")
    assert cause.torchrun_failed(2, "ValueError: bad flag\n", False, [], "accelerate") == (
        "accelerate exited with code 2 before starting workers: ValueError: bad flag")
