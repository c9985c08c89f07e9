"""Issue 15 on RunState, fed journal records the way a subscription feeds it.

Silent ranks (a Hugging Face Trainer logs on rank 0 only) run, stall and recover with the
run; the run's state never goes back to `starting`; a metric without a step leaves the step
unknown; checkpoints (and the ones the trainer deleted) reach `status --json` and `logs`;
a replay of several nodes prints in time order (or node by node); a node whose torchrun
restarted a worker that aborted after the last step is due to be stopped as failed.
"""

from __future__ import annotations

import io

from console.verbs.headless import HeadlessPrinter
from console.judgement.local_judge import check_stalls, ends_due
from console.model.state import RunState
from console.model.summary import status_table
from console.lines.timeorder import TimeOrder

T0 = 1_700_000_000.0
NODES = [("node0", "10.0.0.1"), ("node1", "10.0.0.2")]


def launched(state, node, ts):
    state.apply_records(node, [[{"k": "event", "what": "launched", "pid": 1, "launch": 1,
                                 "ts": ts}]], 0)


def worker(state, node, fid, rank, ts, attempt=0):
    state.apply_records(node, [[{"k": "file", "f": fid, "rank": rank, "local_rank": 0,
                                 "stream": "stdout", "attempt": attempt, "instance": "i",
                                 "path": "p%d" % fid, "world_size": 2, "ts": ts}]], 0)


def metric(state, node, fid, ts, **fields):
    state.apply_records(node, [[dict({"k": "metric", "f": fid, "ts": ts}, **fields)]], 0)


def ended(state, node, ts, what="exited", code=0, cause=None):
    state.apply_records(node, [[{"k": "event", "what": "ended", "state": what,
                                 "exit_code": code, "cause": cause, "ts": ts}]], 0)


def hf_run():
    """node0 holds rank 0, which prints steps; node1 holds rank 1, which prints nothing."""
    state = RunState("r", NODES)
    for node in ("node0", "node1"):
        launched(state, node, T0)
    worker(state, "node0", 1, 0, T0 + 1)
    worker(state, "node1", 1, 1, T0 + 1)
    return state


def test_a_silent_rank_runs_stalls_and_recovers_with_the_run():
    state = hf_run()
    assert state.ranks[1].state == "starting" and state.run_state() == "starting"
    metric(state, "node0", 1, T0 + 10, step=5, loss=2.0, step_time=1.0)
    assert state.ranks[1].state == "running", "a silent rank runs once the run steps"
    assert state.nodes["node1"].state == "running"
    doc = {r["rank"]: r for n in state.status(T0 + 11)["nodes"] for r in n["ranks"]}
    assert doc[1]["silent"] is True and doc[0]["silent"] is False
    assert "running (silent)" in status_table(state.status(T0 + 11))

    stalled = check_stalls(state, now=T0 + 10 + 61)  # no step of the run for 61 s
    assert {r.rank for r in stalled} == {0, 1}
    assert state.ranks[1].state == "stalled"
    assert any(e.kind == "stalled" and e.rank == 1 and "prints no steps" in e.text
               for e in state.events)
    metric(state, "node0", 1, T0 + 80, step=6, loss=1.9, step_time=1.0)
    assert state.ranks[1].state == "running" and state.ranks[0].state == "running"
    assert any(e.kind == "recovered" and e.rank == 1 for e in state.events)


def test_a_silent_rank_whose_worker_started_after_the_step_waits():
    state = hf_run()
    worker(state, "node1", 2, 1, T0 + 20, attempt=1)  # a restarted worker of rank 1
    state.ranks[1].state = "starting"
    metric(state, "node0", 1, T0 + 10, step=5, loss=2.0)  # a step from before it started
    assert state.ranks[1].state == "starting"
    metric(state, "node0", 1, T0 + 30, step=6, loss=2.0)
    assert state.ranks[1].state == "running"


def test_the_run_never_goes_back_to_starting():
    state = hf_run()
    metric(state, "node0", 1, T0 + 10, step=5, loss=2.0)
    ended(state, "node0", T0 + 20)  # rank 0's node is done first; rank 1's still tears down
    state.ranks[1].state = "exited"  # and its rank too (a restart that has not begun)
    assert state.run_state() == "running"
    ended(state, "node1", T0 + 21)
    assert state.run_state() == "succeeded"


def test_a_metric_without_a_step_leaves_the_step_unknown():
    state = hf_run()
    metric(state, "node0", 1, T0 + 10, loss=2.5)  # HF with disable_tqdm: no step anywhere
    metric(state, "node0", 1, T0 + 11, loss=2.4)
    rank = state.ranks[0]
    assert rank.step is None and rank.loss == 2.4 and rank.state == "running"
    assert list(rank.points) == []
    metric(state, "node0", 1, T0 + 12, step=40, loss=2.3)
    assert rank.step == 40


def test_checkpoints_and_the_deleted_ones_are_in_the_status():
    state = hf_run()
    for step in (10, 20):
        state.apply_records("node0", [[{"k": "ckpt", "f": 1, "step": step, "bytes": 1000,
                                        "path": "/c/step_%d" % step, "ts": T0 + step}]], 0)
    state.apply_records("node0", [[{"k": "ckpt_gone", "f": 1, "step": 10,
                                    "path": "/c/step_10", "ts": T0 + 25}]], 0)
    doc = state.status(T0 + 30)["checkpoints"]
    assert [(c["step"], c["path"], c["exists"], c["rank"], c["node"]) for c in doc] == [
        (10, "/c/step_10", False, 0, "node0"), (20, "/c/step_20", True, 0, "node0")]
    assert doc[0]["ts"] == T0 + 10 and doc[0]["deleted"] == T0 + 25
    assert [e.text for e in state.events if e.kind == "checkpoint deleted"] == [
        "checkpoint step 10 deleted by the trainer: /c/step_10"]
    assert "2 saved, 1 deleted by the trainer; newest step 20" in status_table(
        state.status(T0 + 30))


def test_time_order_holds_a_node_until_the_others_cannot_send_older():
    out = []
    order = TimeOrder(["a", "b"], out.append)
    order.add("a", 1.0, "a1")
    order.add("a", 3.0, "a3")
    assert out == []  # b may still send something older
    order.add("b", 2.0, "b2")
    assert out == ["a1", "b2"]
    order.finish("b")
    assert out == ["a1", "b2", "a3"]
    order.add("b", 0.5, "b-late")  # done nodes pass at once (a live run)
    order.add("a", 2.5, "a-back")  # a clock going back on one host keeps that host's order
    assert out[3:] == ["b-late", "a-back"]


def test_by_node_keeps_each_node_together():
    out = []
    order = TimeOrder(["a", "b"], out.append, by_node=True)
    order.add("b", 1.0, "b1")
    order.add("a", 2.0, "a2")
    assert out == ["a2"]
    order.finish("a")
    order.add("b", 3.0, "b3")
    assert out == ["a2", "b1", "b3"]


def test_a_replay_prints_in_time_order_with_checkpoint_events():
    state = RunState("r", NODES)
    out = io.StringIO()
    printer = HeadlessPrinter(state, out=out, colour=False, events=("checkpoint",))
    printer.in_time_order({"node0": 100, "node1": 100})
    for node, rank in (("node0", 0), ("node1", 1)):  # one node's whole journal, then the next
        recs = [[{"k": "file", "f": 1, "rank": rank, "local_rank": 0, "stream": "stdout",
                  "path": "p", "ts": T0}]]
        for i in range(3):
            ts = T0 + 2 * i + rank
            recs.append([{"k": "data", "f": 1, "o": i, "ts": ts}, "line %d.%d\n" % (rank, i)])
            if i == 1:
                recs.append([{"k": "ckpt", "f": 1, "step": 7, "path": "/c/%s" % node,
                              "ts": ts + 0.5}])
        recs.append([{"k": "event", "what": "launched", "pid": 1, "launch": 1, "ts": T0 + 9}])
        state.apply_records(node, recs, 100)
    assert out.getvalue().splitlines() == [
        "[node0 r0] line 0.0", "[node1 r1] line 1.0", "[node0 r0] line 0.1",
        "[rankdeck] node0: checkpoint step 7 saved: /c/node0",
        "[node1 r1] line 1.1",
        "[rankdeck] node1: checkpoint step 7 saved: /c/node1",
        "[node0 r0] line 0.2", "[node1 r1] line 1.2"]


def aborted_after_last_step(phase1: str | None):
    state = hf_run()
    metric(state, "node0", 1, T0 + 10, step=30, loss=2.0)
    state.nodes["node1"].phase = {"name": phase1} if phase1 else None
    state.apply_records("node0", [[{"k": "event", "what": "worker_failed", "rank": 0,
                                    "local_rank": 0, "exit_code": -6, "ts": T0 + 11}]], 0)
    return state


def test_a_worker_aborted_after_the_last_step_ends_its_node_and_the_waiting_ones():
    state = aborted_after_last_step("finished")
    assert any(e.kind == "worker failed" and "SIGABRT" in e.text for e in state.events)
    due = ends_due(state)
    assert due["node0"]["state"] == "failed"
    assert due["node0"]["cause"]["rank"] == 0
    assert due["node0"]["cause"]["message"].startswith(
        "rank 0 killed by SIGABRT (exit -6) after its last step (step 30)")
    assert due["node1"]["state"] == "exited" and "exit barrier" in due["node1"]["say"]


def test_a_worker_failing_while_the_others_still_train_is_torchruns_to_restart():
    assert ends_due(aborted_after_last_step("workers running")) == {}
    assert ends_due(aborted_after_last_step(None)) == {}


def test_a_run_every_node_of_which_lost_its_supervisor_failed():
    """Supervisors dead without an end (a Slurm step's cgroup ended with the console:
    tests/slurm/test_cgroup_site.py) end the run `failed`, not `starting` for ever; a node
    lost while another still runs leaves the run running."""
    state = hf_run()
    metric(state, "node0", 1, T0 + 10, step=5, loss=2.0, step_time=1.0)
    state.apply_supervisor_state("node0", {"state": "lost"})
    assert state.run_state() == "running"
    ended(state, "node1", T0 + 20)
    assert state.run_state() == "failed"
    fresh = RunState("r", NODES)  # no rank ever started
    for node, _addr in NODES:
        fresh.apply_supervisor_state(node, {"state": "lost"})
    assert fresh.run_state() == "failed" and fresh.status()["state"] == "failed"
