"""torchrun's own record of its workers, read from a real torchrun's console output: the
global rank of a worker that is long gone, the first failure, and the cause built from them."""

import os
import subprocess
import sys

import pytest

from agent.torchrun import cause
from agent.torchrun.log import TorchrunLog, with_rank_record

SCRIPT = """\
import os
print("rank", os.environ["RANK"], flush=True)
if os.environ["LOCAL_RANK"] == "1":
    raise RuntimeError("credential rejected: " + os.environ["API_TOKEN"])
"""


@pytest.fixture(scope="module")
def failed_torchrun(tmp_path_factory):
    """One standalone torchrun, 2 workers that exit at once; local rank 1 raises."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("torchrun")
    script = base / "quick.py"
    script.write_text(SCRIPT)
    console = base / "torchrun.log"
    argv = with_rank_record([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", "--max-restarts", "0",
                             "--log-dir", str(base / "logs"), "--redirects", "3", str(script)],
                            str(base / "ranks.log"))
    with open(str(console), "wb") as out:
        code = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(base),
                               env=dict(os.environ, API_TOKEN="s3cr3t", PYTHONUNBUFFERED="1"),
                               timeout=240)
    return code, base


def test_bootstrap_leaves_other_command_lines_alone():
    argv = ["bench-launcher", "--x", "1", "train.py"]
    assert with_rank_record(argv, "/r") == argv
    wrapped = with_rank_record(["py", "-m", "torch.distributed.run", "--nnodes", "2", "t.py"],
                               "/r")
    assert wrapped[:2] == ["py", "-c"] and wrapped[3:] == ["/r", "torch.distributed.run",
                                                           "--nnodes", "2", "t.py"]


@pytest.mark.e2e
def test_ranks_and_first_failure_of_workers_that_are_gone(failed_torchrun):
    code, base = failed_torchrun
    assert code == 1
    # torchrun's console shows what it showed before: the record went to a file of its own
    assert "Rendezvous complete" not in (base / "torchrun.log").read_text()
    assert "global_ranks=[0, 1]" in (base / "ranks.log").read_text()
    assert TorchrunLog(str(base / "torchrun.log")).rank_of(0, 0) is None
    log = TorchrunLog(str(base / "torchrun.log"), str(base / "ranks.log"))
    # the workers ended long ago: torchrun's record is the only place their ranks are left
    assert log.rank_of(0, 0) == (0, 2)
    assert log.rank_of(0, 1) == (1, 2)
    assert log.rank_of(1, 0) is None  # no restart happened
    failure = log.first_failure()
    assert failure["rank"] == 1 and failure["local_rank"] == 1 and failure["exitcode"] == 1
    # a new launch into the same file forgets the old one's record
    log.new_launch()
    assert log.rank_of(0, 0) is None and log.first_failure() is None


@pytest.mark.e2e
def test_cause_names_the_rank_and_its_exception_with_secrets_masked(failed_torchrun):
    _code, base = failed_torchrun
    failure = TorchrunLog(str(base / "torchrun.log")).first_failure()
    [stderr] = [os.path.join(root, "stderr.log") for root, _d, files in os.walk(str(base / "logs"))
                if root.endswith(os.sep + "1") and "stderr.log" in files]
    with open(stderr) as f:
        text = f.read()
    assert cause.worker_failed(failure, text, ["s3cr3t"]) == \
        "rank 1: RuntimeError: credential rejected: ****"
    assert cause.worker_failed(failure, "", []) == \
        "rank 1: exited with code 1 and no exception in its stderr"
    assert cause.worker_failed(dict(failure, exitcode=-9, signal="Signal 9 (SIGKILL)"), "",
                               []) == "rank 1: killed by Signal 9 (SIGKILL)"


def test_last_exception_of_chained_and_plain_output():
    chained = ("Traceback (most recent call last):\n  File \"a.py\", line 1\n    x()\n"
               "KeyError: 'k'\n\nDuring handling of the above exception, another exception "
               "occurred:\n\nTraceback (most recent call last):\n  File \"a.py\", line 3\n"
               "    raise ValueError('bad config')\n    ^^^^^^^^\nValueError: bad config\n")
    assert cause.last_exception(chained) == "ValueError: bad config"
    assert cause.last_exception("warming up\ntorch.distributed.DistStoreError: timed out\n"
                                "bye\n") == "torch.distributed.DistStoreError: timed out"
    assert cause.last_exception("all good\n") is None


def test_exception_a_rank_printed_through_torchs_rank_prefix():
    # after init_process_group, torch prints an uncaught exception with every line prefixed
    # (torch/distributed/distributed_c10d.py, _distributed_excepthook); issue 29
    token, prefix = "tok-5ecret-93b1-77aa", "tok-5ecret"
    text = ("[rank3]: Traceback (most recent call last):\n"
            "[rank3]:   File \"/w/crash.py\", line 5, in <module>\n"
            "[rank3]:     raise RuntimeError(\"credential rejected: \" + token)\n"
            "[rank3]: RuntimeError: credential rejected: %s\n" % token)
    assert cause.last_exception(text) == "RuntimeError: credential rejected: " + token
    failure = {"rank": 3, "local_rank": 0, "exitcode": 1}
    assert cause.worker_failed(failure, text, [prefix, token]) == \
        "rank 3: RuntimeError: credential rejected: ****"
    # no traceback line, only the exception: still found behind the prefix
    assert cause.last_exception("[rank0]: warming up\n[rank0]: ValueError: bad config\n") == \
        "ValueError: bad config"


def test_torchrun_that_could_not_start_says_why():
    said = "rankdeck: cannot start /nope/python: [Errno 2] No such file or directory\n"
    assert cause.torchrun_failed(127, said, False, []) == (
        "torchrun exited with code 127 before starting workers: " + said.strip())
    assert cause.torchrun_failed(1, "", True, []) == (
        "torchrun exited with code 1; no worker error file (see the rank logs and "
        "torchrun.log)")
    assert cause.masked("key abc and abcdef", ["abc", "abcdef"]) == "key **** and ****"
