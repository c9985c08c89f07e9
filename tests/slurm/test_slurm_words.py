"""What launch --slurm reads from Slurm's words and refuses before it reaches a node (no
Slurm needed)."""

import pytest

from console.verbs.cli import slurm_alone
from console.errors import UsageError
from console.slurm.slurm import job_from_env, node_addrs, parse_job, rendezvous_refusal

from tests.cli import rankdeck

JOB = ("JobId=12 JobName=hold UserId=u(1001) JobState=RUNNING Reason=None Dependency=(null) "
       "TimeLimit=00:05:00 NodeList=node[0-3] BatchHost=node0 NumNodes=4 Command=(null)")


def test_a_job_record_gives_its_state_and_node_list():
    job = parse_job("12", JOB + "\n")
    assert (job.job_id, job.state, job.node_list) == ("12", "RUNNING", "node[0-3]")
    assert job.fields["TimeLimit"] == "00:05:00"


def test_node_records_give_the_address_slurm_reaches_each_node_at():
    text = ("NodeName=node0 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.1.0.11 NodeHostName=node0\n"
            "NodeName=node1 Arch=x86_64 NodeHostName=node1\n")
    assert node_addrs(text) == {"node0": "10.1.0.11", "node1": "node1"}


@pytest.mark.parametrize("name,resolved", [("node0", "127.0.1.1"), ("localhost", "127.0.0.1"),
                                           ("node0", "::1")])
def test_a_rendezvous_on_loopback_is_refused_with_the_fix(name, resolved):
    why = rendezvous_refusal("node0", name, resolved)
    assert why and "loopback" in why and "NodeAddr" in why


def test_a_network_address_is_a_fine_rendezvous():
    assert rendezvous_refusal("node0", "node0", "10.1.0.11") is None


def test_slurm_alone_reads_the_allocation_and_a_script_is_not_taken_for_a_job():
    assert slurm_alone(["launch", "-i", "x", "--slurm", "train.py"]) == \
        ["launch", "-i", "x", "--slurm=env", "train.py"]
    assert slurm_alone(["launch", "--slurm", "42", "t.py"]) == ["launch", "--slurm", "42", "t.py"]
    assert slurm_alone(["launch", "t.py", "--", "--slurm", "x"]) == \
        ["launch", "t.py", "--", "--slurm", "x"]


def test_job_ids(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert job_from_env("env") == "77" and job_from_env("5_3") == "5_3"
    with pytest.raises(UsageError, match="not a Slurm job id"):
        job_from_env("12;rm")
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(UsageError, match="SLURM_JOB_ID"):
        job_from_env("env")


def test_launch_slurm_outside_an_allocation_is_a_usage_error(tmp_path, monkeypatch):
    inv = tmp_path / "login.yaml"
    inv.write_text("hosts:\n  - name: login\n    ssh: login.example\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    res = rankdeck("launch", "-i", str(inv), "--slurm", "train.py")
    assert res.returncode == 2 and "SLURM_JOB_ID" in res.stderr and "Traceback" not in res.stderr


def test_what_a_supervisor_reads_from_squeue():
    from agent.slurm.job import job_end

    assert job_end("7", 0, "RUNNING|None\n", "") is None
    assert job_end("7", 1, "", "slurm_load_jobs error: Unable to contact slurm controller") is None
    assert "was cancelled" in job_end("7", 0, "CANCELLED|None\n", "")
    assert "time limit" in job_end("7", 0, "TIMEOUT|None\n", "")
    assert "over" in job_end("7", 0, "", "") and "over" in job_end(
        "7", 1, "", "slurm_load_jobs error: Invalid job id specified")


def test_time_left_in_seconds():
    from console.slurm.slurm import time_left_s

    assert [time_left_s(t) for t in ("4:32", "1:02:03", "2-01:00:00", "UNLIMITED", "")] == \
        [272, 3723, 176400, None, None]


def test_a_pending_job_in_words():
    from console.slurm.submit import pending_line

    job = {"job": "9", "state": "PENDING", "reason": "Resources"}
    assert pending_line(job, "2026-11-26T05:00:00") == \
        "Slurm job 9 PENDING: waiting for free nodes (Resources); expected start 2026-11-26T05:00:00"
    assert "held by you" in pending_line(dict(job, reason="JobHeldUser"))
    assert "quota" in pending_line(dict(job, reason="QOSMaxNodePerUserLimit"), "N/A")
    assert pending_line(dict(job, reason="Licenses")) == "Slurm job 9 PENDING: Licenses"


def test_the_batch_script_holds_the_nodes_and_says_so():
    from console.slurm.submit import batch_script

    script = batch_script(4, "00:30:00", "gpu", 8)
    for line in ("#SBATCH --nodes=4", "#SBATCH --time=00:30:00", "#SBATCH --partition=gpu",
                 "#SBATCH --gpus-per-node=8"):
        assert line in script.splitlines()
    with pytest.raises(UsageError, match="--time"):
        batch_script(4, "half an hour")
    assert "#SBATCH --requeue" in batch_script(2, "10", requeue=True).splitlines()
    assert "--requeue" not in script


def test_signal_before_outside_slurm_is_a_usage_error(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  - name: a\n    ssh: a.example\n    addr: 10.0.0.1\n")
    res = rankdeck("launch", "-i", str(inv), "--signal-before", "60", "train.py")
    assert res.returncode == 2 and "launch --slurm or submit" in res.stderr, res.stderr


def test_a_run_its_job_outlived_ends_with_it_once_slurm_says_how():
    from console.slurm.slurm import with_job

    job = {"job": "9", "state": "COMPLETING", "reason": "", "time_left_s": None}
    ending = with_job({"state": "running"}, job)
    assert ending["state"] == "running" and "is ending" in ending["slurm"]["ended"]
    over = with_job({"state": "running"}, dict(job, state="CANCELLED"))
    assert over["state"] == "cancelled" and "was cancelled" in over["slurm"]["ended"]
    assert with_job({"state": "succeeded"}, dict(job, state="TIMEOUT"))["state"] == "succeeded"
    assert "ended" not in with_job({"state": "running"}, dict(job, state="RUNNING"))["slurm"]


def test_a_submitted_job_slurm_failed_is_not_said_to_be_the_judges_end():
    """The judge's end of a job ``submit`` made leaves its comment; a job FAILED without it
    Slurm ended (seen: a requeued job started in the second of its requeue, its credential
    revoked), and status says so, not "the run's judge ended it"."""
    from console.slurm.slurm import with_job

    job = {"job": "9", "state": "FAILED", "reason": "NonZeroExitCode", "time_left_s": None}
    slurm_s = with_job({"state": "running"}, job, submitted=True)
    assert slurm_s["state"] == "failed" and "Slurm ended it, not the run's judge" in \
        slurm_s["slurm"]["ended"] and "scontrol show job 9" in slurm_s["slurm"]["ended"]
    judged = with_job({"state": "running"}, dict(job, judged=True), submitted=True)
    assert "the run's judge ended it once the run was over" in judged["slurm"]["ended"]


def test_the_header_counts_the_time_left_down_beside_the_last_complete_checkpoint():
    from console.model.state import RunState
    from console.tui.header import job_left

    state = RunState("r1", [("node0", "10.0.0.1")])
    state.slurm = {"job": "9", "state": "RUNNING", "time_left_s": 600, "at": 1000.0}
    assert job_left(state, 1030.0) == "Slurm 0:09:30 left, no ckpt yet"
    state.checkpoints.saved("node0", 0, {"step": 50, "path": "/c/step_50.pt", "ts": 900.0})
    state.checkpoints.done("node0", {"path": "/c/step_50.pt", "complete": True, "ts": 901.0})
    assert job_left(state, 1030.0) == "Slurm 0:09:30 left, ckpt 0:02:10 ago"
    assert job_left(state, 2000.0).startswith("Slurm 0:00:00 left")


def test_status_says_how_old_the_last_complete_checkpoint_is_and_waits_out_a_requeue():
    import time

    from console.slurm.slurm import with_job

    job = {"job": "9", "state": "PENDING", "reason": "BeginTime", "time_left_s": None}
    st = with_job({"state": "running", "checkpoints": [
        {"step": 50, "ts": time.time() - 70, "last_complete": True}]}, job, requeue=True)
    assert st["state"] == "running" and st["slurm"]["requeued"] and "ended" not in st["slurm"]
    assert 69 <= st["slurm"]["checkpoint_age_s"] <= 80
    assert with_job({"state": "running"}, job)["state"] == "stopped"  # not ours to wait for


def test_a_node_slurm_drains_or_lost_is_said_in_slurm_s_words():
    from console.slurm.slurm import node_words, with_nodes

    text = ("node0|allocated|none\nnode1|draining|disk full\nnode2|down*|Not responding\n"
            "node3|mixed|none\nnode9|drained|other job\n")
    words = node_words(text, ["node0", "node1", "node2", "node3"])
    assert words == {"node1": "draining (disk full)",
                     "node2": "down, not responding (Not responding)"}
    st = with_nodes({"nodes": [{"name": "node1"}, {"name": "node0"}]}, words)
    assert st["nodes"][0]["slurm"] == "draining (disk full)" and "slurm" not in st["nodes"][1]
    assert st["slurm"]["nodes"] == words


def test_a_cgroup_site_is_told_where_the_run_lives():
    """The site's ``scontrol show config``, read by the transport once (its answer stands in
    for the login host's), says proctrack/cgroup: the launch's warning."""
    import asyncio

    from console.slurm.slurm import site_warning
    from console.transport.slurm import SlurmTransport

    def warning(proctrack):
        transport = SlurmTransport("1")
        asked = []

        async def on_login(login, argv, timeout=60, input=None):
            asked.append(argv)
            return 0, config % proctrack, ""
        transport.on_login = on_login
        said = [asyncio.run(site_warning(transport, None)) for _ in range(2)]
        assert said[0] == said[1] and asked == [["scontrol", "show", "config"]]
        return said[0]

    config = "Configuration data as of 2026-11-26T08:00:00\nProctrackType           = %s\n"
    assert "a rankdeck-host step of their own" in warning("proctrack/cgroup")
    assert warning("proctrack/linuxproc") is None


@pytest.mark.parametrize("signal_name, code", [("USR1", 0), ("USR2", 1)])
def test_the_batch_script_holds_until_the_judge_signals_then_ends_as_the_run_did(
        tmp_path, signal_name, code):
    """The judge ends a job `submit` made with a signal to its batch script (agent/judge/judge.py
    release_job): USR1 (the run succeeded) ends it 0, COMPLETED; USR2 ends it 1, FAILED; the
    sleep it waited in does not outlive it."""
    import signal
    import subprocess
    import time

    from agent.host import procs
    from agent.slurm.job import RELEASE_SIGNALS
    from console.slurm.submit import batch_script

    assert RELEASE_SIGNALS[code == 0] == signal_name
    path = tmp_path / "job.sh"
    path.write_text(batch_script(2, "10"))
    shell = subprocess.Popen(["sh", str(path)])
    try:
        deadline = time.monotonic() + 10
        while not procs.descendants(shell.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (sleeper,) = procs.descendants(shell.pid)
        time.sleep(0.3)
        assert shell.poll() is None  # it holds the nodes until told
        shell.send_signal(getattr(signal, "SIG" + signal_name))
        assert shell.wait(timeout=10) == code
        deadline = time.monotonic() + 10
        while procs.stat(sleeper) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs.stat(sleeper) is None
    finally:
        shell.kill()
        shell.wait()
