"""Before a Slurm job's time limit (agent/slurm/job.py, trainer/ckpt_request.py): the request
the ranks read, the requeue one node asks for, the wait and the restart. squeue and scontrol
are small scripts here that answer what the test writes (tests/slurm has the real ones)."""

import os
import subprocess
import sys

from agent.slurm.job import JobTurns, JobWatch
from trainer.ckpt_request import CheckpointRequest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def slurm_commands(tmp_path):
    """(squeue, scontrol, answer file, calls file): squeue prints the answer file; scontrol
    records its arguments and expands any node list to node0..node3."""
    answer, calls = tmp_path / "answer", tmp_path / "calls"
    squeue, scontrol = tmp_path / "squeue", tmp_path / "scontrol"
    squeue.write_text("#!/bin/sh\ncat %s\n" % answer)
    scontrol.write_text("#!/bin/sh\necho \"$@\" >> %s\n[ \"$1\" = show ] && echo node0 node1 "
                        "node2 node3\nexit 0\n" % calls)
    for path in (squeue, scontrol):
        path.chmod(0o755)
    return str(squeue), str(scontrol), answer, calls


def turns(tmp_path, limit, node="node0"):
    squeue, scontrol, answer, calls = slurm_commands(tmp_path)
    job = JobTurns(JobWatch("41", squeue, every=0), node, str(tmp_path), limit, scontrol)
    return job, answer, calls


def test_the_request_comes_at_the_limit_and_the_first_node_requeues_after_a_checkpoint(tmp_path):
    job, answer, calls = turns(tmp_path, {"signal_before": 60, "requeue": True,
                                          "requeuer": True})
    asked = CheckpointRequest(job.request)
    answer.write_text("RUNNING|None|1:30|node[0-3]|2026-11-26T07:00:00\n")
    assert job.turn() is None and not asked.pending()  # 90 s left: nothing yet
    answer.write_text("RUNNING|None|0:58|node[0-3]|2026-11-26T07:00:00\n")
    assert job.turn(lambda: 0.0) is None
    assert asked.pending() and asked.number() == 20261126070000
    assert asked.reason() == "Slurm job 41: 58 s left before its time limit (2026-11-26T07:00:00)"
    assert not calls.exists()  # no checkpoint complete since the request: no requeue yet
    asked.answered()
    assert not asked.pending()
    assert job.turn(lambda: job.asked_at - 1) is None and not calls.exists()  # an older save
    kind, why = job.turn(lambda: job.asked_at + 1)  # a checkpoint since the line was crossed
    assert calls.read_text().split("\n")[0] == "requeue 41"
    assert kind == "wait" and "requeued (scontrol requeue, 58 s before its time limit)" in why
    answer.write_text("PENDING|BeginTime|1:00|\n")
    assert job.turn() is None  # said once
    answer.write_text("RUNNING|None|1:00|node[0-3]|2026-11-26T07:03:00\n")
    assert job.turn()[0] == "resume"
    assert job.rejoin_argv(["torchrun", "--rdzv-id", "run1", "train.py"]) == \
        ["torchrun", "--rdzv-id", "run1-job20261126070300", "train.py"]
    job.new_run()
    assert not os.path.exists(job.request) and job.turn() is None


def test_the_other_nodes_never_requeue_and_a_job_back_on_other_nodes_ends_this_one(tmp_path):
    job, answer, calls = turns(tmp_path, {"signal_before": 60, "requeue": True,
                                          "requeuer": False}, node="node7")
    answer.write_text("RUNNING|None|0:10|node[0-3]\n")  # late: the requeuer would go now
    assert job.turn(lambda: 1e12) is None and not calls.exists()
    answer.write_text("COMPLETING|None|0:00|node[0-3]\n")  # a requeue passes through it
    assert job.turn() is None
    answer.write_text("REQUEUED|None|1:00|\n")
    kind, why = job.turn()
    assert kind == "wait" and "requeued (REQUEUED)" in why
    answer.write_text("RUNNING|None|1:00|node[0-3]\n")
    kind, why, _state = job.turn()
    assert kind == "end" and "other nodes" in why


def test_without_requeue_the_job_s_end_ends_the_run(tmp_path):
    job, answer, _calls = turns(tmp_path, {"signal_before": 60})
    answer.write_text("PENDING|None|1:00|\n")  # an administrator's requeue: not ours to wait
    assert job.turn()[0] == "end"
    answer.write_text("TIMEOUT|TimeLimit|0:00|node0\n")
    kind, why, state = job.turn()
    assert (kind, state) == ("end", "TIMEOUT") and "reached its time limit" in why


def test_the_reference_trainer_saves_when_asked_and_goes_on(tmp_path):
    request = tmp_path / "checkpoint-request"
    request.write_text("20261126070000 Slurm job 41: 58 s left\n")
    res = subprocess.run([sys.executable, "trainer/train.py", "--steps", "3", "--ckpt-every",
                          "0", "--d-model", "16", "--layers", "1", "--seq-len", "16",
                          "--synthetic-samples", "64", "--ckpt-dir", str(tmp_path / "ckpt")],
                         cwd=REPO, env=dict(os.environ, RANKDECK_CHECKPOINT_REQUEST=str(request),
                                            PYTHONPATH=REPO),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    asked = lines.index("checkpoint requested: Slurm job 41: 58 s left")
    assert lines[asked - 1].startswith("step=1 ")
    assert lines[asked + 1].startswith("checkpoint saved step=1 ")  # once, then on
    assert [ln.split()[2] for ln in lines if ln.startswith("checkpoint saved")] == \
        ["step=1", "step=3"] and lines[-1] == "done steps=3"


def test_a_run_its_slurm_job_cancelled_ends_cancelled_in_the_judge_s_journal_and_notifies_stopped():
    from agent.rules.notify import kind_of
    from agent.rules.judge import run_over
    from agent.rules.judge_view import RunView

    view = RunView(["node0", "node1"], 60)
    why = "Slurm job 41 was cancelled (scancel): the run ended with it"
    view.apply_state("node0", {"state": "stopped", "cause": {"message": why,
                                                             "slurm": "CANCELLED"}})
    view.apply_state("node1", {"state": "stopped", "cause": {"message": why, "slurm": "CANCELLED"}})
    assert run_over(view) == ("cancelled", {"node": "node0", "message": why})
    view.apply_state("node1", {"state": "stopped", "cause": {"message": "stopped by you"}})
    view.apply_state("node0", {"state": "stopped", "cause": None})
    assert run_over(view) == ("stopped", None)  # a stop of rankdeck's stays a stop
    assert kind_of({"what": "run_ended", "state": "cancelled"}) == "stopped"


def test_ranks_that_fail_as_the_job_is_requeued_wait_for_it_and_a_running_job_s_failure_is_one(
        tmp_path):
    job, answer, _calls = turns(tmp_path, {"signal_before": 60, "requeue": True,
                                           "requeuer": False})
    answer.write_text("RUNNING|None|5:00|node[0-3]\n")  # no request on this node yet
    assert job.after_exit() is None  # the job runs: the ranks failed on their own
    answer.write_text("PENDING|BeginTime|2:00|\n")  # another node requeued it
    assert job.after_exit()[0] == "wait"


def test_a_job_requeued_and_running_again_between_two_looks_is_waited_for_then_resumed(
        tmp_path):
    """Slurm may run a requeued job again before a node's next look (an idle cluster, an
    administrator's StartTime=now): the node never sees it queued, only its start time
    change; its ranks, failing as their peers were ended, wait and resume, not fail."""
    job, answer, _calls = turns(tmp_path, {"signal_before": 60, "requeue": True,
                                           "requeuer": False})
    answer.write_text("RUNNING|None|5:00|node[0-3]|2026-11-26T07:05:00|2026-11-26T07:00:00\n")
    assert job.turn() is None
    assert job.after_exit() is None  # the same run of the job: the ranks' own failure
    answer.write_text("RUNNING|None|5:00|node[0-3]|2026-11-26T07:05:00|2026-11-26T07:00:00\n")
    assert job.turn() is None  # an administrator's TimeLimit change moves the end, not the start
    answer.write_text("RUNNING|None|5:00|node[0-3]|2026-11-26T07:12:00|2026-11-26T07:07:00\n")
    kind, why = job.after_exit()
    assert kind == "wait" and "already runs again" in why
    assert job.turn()[0] == "resume"
    assert job.rejoin_argv(["torchrun", "--rdzv-id", "run1", "train.py"]) == \
        ["torchrun", "--rdzv-id", "run1-job20261126071200", "train.py"]
    job.new_run()  # (the supervisor, starting the ranks again)
    assert job.turn() is None and job.after_exit() is None  # this run is the node's now


def test_ranks_that_fail_as_the_job_is_cancelled_end_with_the_job_with_or_without_requeue(
        tmp_path):
    for requeue in (False, True):
        job, answer, _calls = turns(tmp_path, {"signal_before": 60, "requeue": requeue,
                                               "requeuer": False})
        answer.write_text("RUNNING|None|5:00|node[0-3]\n")
        assert job.after_exit(wait_s=0.5) is None  # the job runs: the ranks' own failure
        answer.write_text("CANCELLED|None|0:00|node[0-3]\n")
        assert job.after_exit(wait_s=0.5) == (
            "end", "Slurm job 41 was cancelled (scancel): the run ended with it", "CANCELLED")
