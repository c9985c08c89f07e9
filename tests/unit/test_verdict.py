"""The verdict from reports shaped as agent/torchrun/fr_dump.py sends them (entries as the hook reads
them from torch 2.13's gloo flight recorder; stacks as py-spy prints them)."""

import os
import subprocess
import sys

from agent.torchrun.fr_dump import sources
from console.lines.sanitize import Masker, mask_tree
from agent.rules.verdict import decide, frame_of
from console.judgement.verdict import evidence_lines, verdict_lines

STUCK_STACK = '''Thread 11 (idle): "MainThread"
    injected_hang (trainer/faults.py:87)
    fire_if_due (trainer/faults.py:66)
    run (trainer/train.py:256)
'''
WAITING_STACK = '''Thread 12 (idle): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:841)
    backward (torch/autograd/__init__.py:364)
    train_step (trainer/train.py:238)
'''


def entry(seq, done=True, op="gloo:all_reduce", size=21600, t_ns=None):
    return {"pg": "0", "seq": seq, "p2p": False, "op": op, "in": [[size]], "out": [[size]],
            "done": done, "t_ns": t_ns if t_ns is not None else seq * 10**9}


def report(rank, entries, stack=WAITING_STACK, node=None):
    return {"rank": rank, "node": node or "node%d" % rank, "pid": 100 + rank, "stack": stack,
            "fr": {"entries": entries}}


def hung_at(stuck_rank, seq=5):
    return [report(r, [entry(seq - 1), entry(seq, done=False)]) if r != stuck_rank
            else report(r, [entry(seq - 1)], STUCK_STACK) for r in range(4)]


def test_the_rank_missing_from_the_collective_is_named_with_its_line():
    v = decide(hung_at(2))
    assert v["kind"] == "stuck-in-python"
    assert v["suspects"] == [{"rank": 2, "node": "node2",
                              "frame": "trainer/faults.py:87 in injected_hang", "source": None}]
    assert v["evidence"]["waiting_ranks"] == [0, 1, 3]
    assert v["evidence"]["waiting_in"] == {"pg": "0", "seq": 5, "op": "gloo:all_reduce",
                                           "sizes": "[[21600]]"}
    assert verdict_lines(v)[1] == "  suspect rank 2 on node2 at trainer/faults.py:87 in injected_hang"


def test_a_job_that_moved_between_two_samples_has_no_suspect():
    # one sample of a healthy job can look like a hang: rank 2 had not entered #5 yet
    later = [report(r, [entry(6), entry(7, done=False)]) for r in range(4)]
    v = decide(later, earlier=hung_at(2))
    assert v["kind"] == "unknown" and v["suspects"] == []
    assert decide(hung_at(2), earlier=hung_at(2))["suspects"][0]["rank"] == 2


def test_the_rank_in_another_collective_is_named():
    reports = [report(r, [entry(4), entry(5, done=False)]) for r in (0, 2, 3)]
    reports.append(report(1, [entry(4), entry(5, done=False, op="gloo:broadcast", size=7)],
                          STUCK_STACK))
    v = decide(reports)
    assert v["kind"] == "mismatch"
    assert [s["rank"] for s in v["suspects"]] == [1]
    assert v["evidence"]["majority"]["op"] == "gloo:all_reduce"
    assert v["evidence"]["collectives"]["1"]["sizes"] == "[[7]]"


def test_a_mismatch_without_a_majority_names_nobody():
    reports = [report(r, [entry(5, done=False, size=10 if r < 2 else 20)]) for r in range(4)]
    v = decide(reports)
    assert v["kind"] == "mismatch" and v["suspects"] == []


def test_a_rank_without_a_trace_means_no_suspect():
    reports = hung_at(2)
    reports[1]["fr"] = {"error": "the rank's flight-recorder hook is not listening"}
    v = decide(reports)
    assert v["kind"] == "unknown" and v["suspects"] == []
    assert "not listening" in v["evidence"]["trace_errors"]["1"]


def test_a_rank_the_run_knows_that_did_not_report_means_no_suspect():
    v = decide(hung_at(2)[:3], expected={0: "node0", 1: "node1", 2: "node2", 3: "node3"})
    assert v["kind"] == "unknown" and v["suspects"] == []


def test_the_ranks_of_an_unreachable_node_are_named():
    reports = [report(r, [entry(4), entry(5, done=False)]) for r in (0, 1, 2)]
    v = decide(reports, unreachable={"node3": "node3: why got no answer within 20 s"},
               expected={0: "node0", 1: "node1", 2: "node2", 3: "node3"})
    assert v["kind"] == "unreachable"
    assert v["suspects"] == [{"rank": 3, "node": "node3", "frame": None, "source": None}]
    assert v["evidence"]["waiting_ranks"] == [0, 1, 2]


def _every(late_s, step_s=1.0, late_rank=3):
    """Four ranks' reports with 20 collectives ``step_s`` apart, ``late_rank`` entering each
    ``late_s`` after the others (plus microseconds of jitter), and a second sample one
    collective later: nobody hung."""
    def entries(late):
        return [entry(s, t_ns=int(s * step_s * 1e9 + late * 1e9) + (s % 3) * 1000)
                for s in range(1, 21)]
    reports = [report(r, entries(late_s if r == late_rank else 0.0)) for r in range(4)]
    later = [dict(r, fr={"entries": r["fr"]["entries"] + [entry(21, t_ns=int(21 * step_s * 1e9))]})
             for r in reports]
    return later, reports


def test_the_rank_the_others_wait_for_is_a_straggler():
    later, earlier = _every(0.5)  # the others wait half of every step for rank 3
    v = decide(later, earlier=earlier)
    assert v["kind"] == "straggler"
    assert [s["rank"] for s in v["suspects"]] == [3]
    assert v["evidence"]["share"]["3"] >= 0.45, v["evidence"]
    assert "500 ms after the others" in v["summary"], v["summary"]


def test_a_rank_late_by_a_small_part_of_a_step_is_not_named():
    """18 ms late in 100 ms steps: what one rank sharing its core with other work shows (the
    last fresh-clone suite, beside a CPU hog): the machine, not the job. 60 ms is the job."""
    assert decide(*_every(0.018, step_s=0.1))["suspects"] == []
    v = decide(*_every(0.06, step_s=0.1))
    assert v["kind"] == "straggler" and [s["rank"] for s in v["suspects"]] == [3], v
    assert decide(*_every(0.0))["suspects"] == []  # jitter alone, same for everyone


def test_a_source_below_the_scripts_project_folder_is_read(tmp_path):
    """A script that puts its project on sys.path itself (trainer/train.py does) is shortened
    by py-spy below that folder: the script's parent is searched, with no PYTHONPATH given."""
    project = tmp_path / "proj"
    (project / "trainer").mkdir(parents=True)
    (project / "trainer" / "faults.py").write_text("\n" * 86 + "        time.sleep(3600)\n")
    (project / "trainer" / "train.py").write_text("print(1, flush=True); input()\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rank = subprocess.Popen([sys.executable, str(project / "trainer" / "train.py")],
                            cwd=str(elsewhere), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={})
    try:
        rank.stdout.readline()  # it runs
        assert sources(STUCK_STACK, rank.pid) == {"trainer/faults.py:87": "time.sleep(3600)"}
    finally:
        rank.kill()
        rank.wait()


def test_the_frame_is_the_innermost_outside_torch():
    assert frame_of(WAITING_STACK) == "trainer/train.py:238 in train_step"
    assert frame_of(None) is None


def test_the_suspects_source_line_is_read_on_its_host_and_shown(tmp_path):
    """The agent reads each frame's line from the rank's working directory (py-spy prints
    paths as imported); the verdict picks the suspect's own frame's line, cleaned."""
    (tmp_path / "trainer").mkdir()
    line = "        time.sleep(3600)  \x1b[2J\n"
    (tmp_path / "trainer" / "faults.py").write_text("\n" * 86 + line)
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "f.py")  # never opened for a read that blocks
    stack = STUCK_STACK + '  File "%s", line 1 in x\n' % (tmp_path / "fifo" / "f.py")
    # a rank of its own: in this process a PYTHONPATH holding the repo finds trainer/train.py
    rank = subprocess.Popen([sys.executable, "-c", "print(1, flush=True); input()"],
                            cwd=str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={})
    try:
        rank.stdout.readline()  # it runs
        read = sources(stack, rank.pid)
    finally:
        rank.kill()
        rank.wait()
    assert read == {"trainer/faults.py:87": line.strip()}
    # py-spy shortens a path below a sys.path entry: PYTHONPATH is searched too
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rank = subprocess.Popen([sys.executable, "-c", "print(1, flush=True); input()"],
                            cwd=str(elsewhere), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={"PYTHONPATH": "/nonexistent:%s" % tmp_path})
    try:
        rank.stdout.readline()  # it runs
        assert sources(STUCK_STACK, rank.pid) == {"trainer/faults.py:87": line.strip()}
    finally:
        rank.kill()
        rank.wait()
    reports = hung_at(2)
    reports[2]["sources"] = read
    v = decide(reports)
    assert v["suspects"][0]["source"] == "time.sleep(3600)"  # the escape sequence is gone
    assert verdict_lines(v)[2] == "    > time.sleep(3600)"


def test_the_evidence_says_where_the_others_wait():
    assert evidence_lines(decide(hung_at(2))) == [
        "rank(s) 0-1,3 wait in gloo:all_reduce #5 (pg 0) sizes [[21600]]",
        "rank 2 finished gloo:all_reduce #4 (pg 0) sizes [[21600]] last"]
    v = decide([report(r, [entry(4)]) for r in range(4)])
    assert evidence_lines(v) == [v["evidence"]["why"]]


def test_secrets_are_masked_in_the_whole_verdict():
    """A source line can hold a secret (``token = "hf_..."``): the verdict kept and sent is
    masked like every line (console/judgement/why.py masks it before it is kept)."""
    reports = hung_at(2)
    reports[2]["sources"] = {"trainer/faults.py:87": 'login(token="hf_s3cr3tvalue")'}
    v = mask_tree(decide(reports), Masker(["hf_s3cr3tvalue"]))
    assert v["suspects"][0]["source"] == 'login(token="****")'
    assert "hf_s3cr3tvalue" not in repr(v)
