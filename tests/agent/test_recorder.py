"""What the supervisor's recorder journals (agent/supervisor/recorder.py), without torchrun: real rank
files in a torchrun-shaped log folder, a real follower and a real journal, read back."""

import os

from agent.host.journal import JournalReader, JournalWriter
from agent.rules.mask import Masker
from agent.supervisor.recorder import Recorder
from agent.host.tail import LogFollower

SECRET = "s3cr3t-token-1234"
INSTANCE = "run_abc"  # torchrun's <rdzv-id>_<random8> folder of the current start


def rank_file(log_dir, local_rank, stream, attempt=0):
    folder = os.path.join(log_dir, INSTANCE, "attempt_%d" % attempt, str(local_rank))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, stream + ".log")


def append(path, data):
    with open(path, "ab") as f:
        f.write(data)


def journaled(path):
    return [(meta, data) for meta, data, _end in JournalReader(path).read()]


def make_recorder(tmp_path, logged, current=INSTANCE):
    log_dir = str(tmp_path / "logs")
    os.makedirs(log_dir)
    console = str(tmp_path / "torchrun.log")
    append(console, b"")
    masker = Masker([SECRET])  # as the supervisor's: the follower never cuts in a secret
    follower = LogFollower(log_dir, lambda attempt, local_rank: (10 + local_rank, {}),
                           keep_whole=masker.safe_cut)
    follower.add(console, stream="torchrun", attempt=None, local_rank=None, instance=None)
    journal = JournalWriter(str(tmp_path / "journal"))
    recorder = Recorder(journal, follower, masker, "node1", None, str(tmp_path), None,
                        lambda: current, logged.append)
    return recorder, log_dir, console


def test_a_workers_lines_are_masked_parsed_and_its_failure_named(tmp_path):
    logged = []
    recorder, log_dir, console = make_recorder(tmp_path, logged)
    out, err = rank_file(log_dir, 1, "stdout"), rank_file(log_dir, 1, "stderr")
    append(out, b"step=3 loss=0.5 lr=1e-3 token %s\n"
                b"checkpoint saved step=3 path=ckpt/step_3.pt bytes=10\n" % SECRET.encode())
    append(err, b"Traceback (most recent call last):\nRuntimeError: bad key %s\n"
           % SECRET.encode())
    assert recorder.pump(final=True) > 0
    # torchrun reports the failure after the worker's files were announced
    append(console, b"E1123 13:46:04.111000 18546 api.py:1002] failed (exitcode: 1) "
                    b"local_rank: 1 (pid: 4242) of binary: /usr/bin/python\n")
    recorder.pump(final=True)
    recorder.deleted_checkpoints(final=True)

    records = journaled(str(tmp_path / "journal"))
    data = b"".join(d for m, d in records if m["k"] == "data")
    assert SECRET.encode() not in data and data.count(b"****") == 2
    files = {m["f"]: m for m, _d in records if m["k"] == "file"}
    (err_fid,) = [f for f, m in files.items() if m.get("stream") == "stderr"]
    (out_fid,) = [f for f, m in files.items() if m.get("stream") == "stdout"]
    assert files[err_fid]["rank"] == 11
    metric = next(m for m, _d in records if m["k"] == "metric")
    assert (metric["f"], metric["step"], metric["loss"]) == (out_fid, 3, 0.5)
    assert [m["step"] for m, _d in records if m["k"] == "ckpt_done"] == [3]
    (failed,) = [m for m, _d in records if m.get("what") == "worker_failed"]
    assert (failed["rank"], failed["local_rank"], failed["attempt"], failed["pid"],
            failed["exit_code"], failed["node"]) == (11, 1, 0, 4242, 1, "node1")
    # what the supervisor asks for a failure's cause: the stderr tail, masked too
    assert recorder.stderr_of(INSTANCE, 1) == (err_fid, 0)
    assert recorder.stderr_tail(err_fid).endswith("RuntimeError: bad key ****\n")
    assert recorder.rank_of(INSTANCE, 1, 0) == 11
    # what the judge's link forwards: the workers' files (not torchrun's own) and their ranks
    assert recorder.files_by_rank() == {out_fid: 11, err_fid: 11}
    assert logged == []


def test_a_failure_in_an_older_torchrun_start_names_no_rank(tmp_path):
    logged = []
    recorder, log_dir, console = make_recorder(tmp_path, logged, current="run_new")
    append(rank_file(log_dir, 0, "stderr"), b"oops\n")
    recorder.pump(final=True)
    append(console, b"failed (exitcode: -9) local_rank: 0 (pid: 7)\n")
    recorder.pump(final=True)
    (failed,) = [m for m, _d in journaled(str(tmp_path / "journal"))
                 if m.get("what") == "worker_failed"]
    assert (failed["rank"], failed["attempt"], failed["exit_code"]) == (None, None, -9)


def test_a_parser_that_fails_is_logged_and_the_lines_still_journaled(tmp_path):
    logged = []
    recorder, log_dir, _console = make_recorder(tmp_path, logged)

    class BrokenParser:
        def parse(self, text, file=None, worker=None):
            raise ValueError("parser bug")

    recorder.parser = BrokenParser()
    append(rank_file(log_dir, 0, "stdout"), b"step=1 loss=2.0\n")
    recorder.pump(final=True)
    records = journaled(str(tmp_path / "journal"))
    assert b"".join(d for m, d in records if m["k"] == "data") == b"step=1 loss=2.0\n"
    assert not [m for m, _d in records if m["k"] == "metric"]
    assert logged == ["metrics parser failed: ValueError('parser bug')"]


def test_a_deepspeed_rank_file_is_a_workers_file_its_metrics_and_saves_parsed(tmp_path):
    # DeepSpeed's --enable_each_rank_log writes <time>_rank<R>.log flat in the log dir: the
    # rank is its name's, there is no local rank; its lines are a rank's all the same (seen on
    # an H200: the run's summary had no step or loss under DeepSpeed)
    recorder, log_dir, _console = make_recorder(tmp_path, [])
    path = os.path.join(log_dir, "20261126044851_rank3.log")
    append(path, b"step=7 loss=0.25 lr=1e-3\n"
                 b"checkpoint saved step=7 path=ckpt/step_7 bytes=10\n")
    recorder.pump(final=True)
    recorder.deleted_checkpoints(final=True)
    records = journaled(str(tmp_path / "journal"))
    (fid,) = [m["f"] for m, _d in records if m["k"] == "file" and m.get("rank") == 3]
    metric = next(m for m, _d in records if m["k"] == "metric")
    assert (metric["f"], metric["step"], metric["loss"]) == (fid, 7, 0.25)
    assert [m["step"] for m, _d in records if m["k"] == "ckpt_done"] == [7]
    assert recorder.files_by_rank() == {fid: 3}
