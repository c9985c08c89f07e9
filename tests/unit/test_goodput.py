"""Goodput's reducer (agent/rules/goodput.py) over synthetic journal records: each bucket, the
incident's latencies and steps redone, a node's clock put on the judge's, work at risk."""

from __future__ import annotations

import pytest

from agent.rules.goodput import BUCKETS, Goodput


class Run:
    """Two nodes of one rank each (node0: rank 0, node1: rank 1), fed as their journals are."""

    def __init__(self, skew: float = 0.0):
        self.g = Goodput()
        self.skew = {"node0": 0.0, "node1": skew}  # each host's clock ahead of the judge's
        for rank, node in enumerate(("node0", "node1")):
            self.node(node, {"k": "event", "what": "launched"}, 0.0)
            self.node(node, {"k": "file", "f": 2, "rank": rank})

    def node(self, node, meta, ts=None):
        if ts is not None:
            meta = dict(meta, ts=ts + self.skew[node])
        self.g.add(node, meta)

    def steps(self, first, last, t0, every=1.0, f=2):
        for i, step in enumerate(range(first, last + 1)):
            for node in ("node0", "node1"):
                self.node(node, {"k": "metric", "step": step, "loss": 1.0, "f": f},
                          t0 + i * every)

    def judge(self, what, ts, **fields):
        self.g.add(None, dict({"k": "event", "what": what, "node": None}, ts=ts, **fields))

    def end(self, ts):
        for node in ("node0", "node1"):
            self.node(node, {"k": "event", "what": "ended", "state": "stopped"}, ts)

    def report(self, now=None):
        out = self.g.report(now)
        assert set(out["buckets"]) == set(BUCKETS)
        assert sum(out["buckets"].values()) == pytest.approx(out["wall_s"], abs=1e-3)
        return out


def test_a_clean_run_is_start_up_stepping_and_its_end():
    run = Run()
    run.steps(1, 91, 10.0)  # the last step at 100
    run.end(105.0)
    out = run.report()
    assert out["wall_s"] == 105.0 and out["ended"]
    assert out["buckets"]["start-up"] == 10.0
    assert out["buckets"]["productive"] == 90.0
    assert out["buckets"]["end"] == 5.0
    assert out["goodput"] == pytest.approx(90 / 105, abs=1e-4)
    assert out["incidents"] == []


def test_a_checkpoint_save_is_the_step_to_its_checkpoint_line():
    run = Run()
    run.steps(1, 50, 10.0)  # step 50 at 59
    run.node("node0", {"k": "ckpt", "step": 50, "path": "/c/50", "f": 2}, 62.0)
    run.node("node1", {"k": "ckpt", "step": 50, "path": "/c/50", "f": 2}, 61.0)
    run.steps(51, 60, 63.0)  # the last step at 72
    run.end(72.0)
    out = run.report()
    assert out["buckets"]["checkpoint"] == 3.0  # 59 to 62: the two ranks' saves overlap
    assert out["buckets"]["productive"] == 72.0 - 10.0 - 3.0


def test_a_rendezvous_wait_is_the_judges_waiting_to_waiting_over():
    run = Run()
    run.steps(1, 91, 10.0)
    run.judge("waiting", 60.0, waited_s=5.0, round=2)
    run.judge("waiting over", 62.0, round=2)
    run.end(100.0)
    out = run.report()
    assert out["buckets"]["rendezvous"] == 7.0
    assert out["buckets"]["productive"] == 90.0 - 7.0


def stalled_and_restarted(skew: float = 0.0) -> Run:
    """Steps 1-20 (10..29 s); rank 1 stalls, seen 6 s later; verdict 36, restart 37; every rank
    steps again at 50 from step 16 (resumed from checkpoint 15), passes step 20 at 55."""
    run = Run(skew)
    run.steps(1, 20, 10.0)
    run.node("node0", {"k": "ckpt", "step": 15, "path": "/c/15", "f": 2}, 24.5)
    run.node("node0", {"k": "ckpt_done", "step": 15, "path": "/c/15", "complete": True}, 25.0)
    run.judge("stalled", 35.0, node="node1", rank=1, step=20, idle_s=6.0)
    run.judge("stalled", 35.0, node="node0", rank=0, step=20, idle_s=6.0)
    run.judge("verdict", 36.0, verdict={"kind": "stuck-in-python",
                                        "suspects": [{"rank": 1, "node": "node1"}]})
    run.judge("policy", 37.0, node="node1", action="restart", text="restarting node1")
    run.judge("restarted", 45.0, node="node1", reason="on-hang")
    for node in ("node0", "node1"):  # the new attempt's files, then its steps
        run.node(node, {"k": "file", "f": 4, "rank": 0 if node == "node0" else 1})
    run.steps(16, 40, 50.0, f=4)  # step 21 at 55
    run.judge("stepping", 50.0, node="node1", rank=1, step=16)
    run.judge("stepping", 50.0, node="node0", rank=0, step=16)
    run.end(80.0)
    return run


def test_a_stall_restarted_is_stalled_recovery_and_steps_redone():
    run = stalled_and_restarted()
    out = run.report()
    b = out["buckets"]
    assert b["stalled"] == 8.0  # the last step (29) to the restart (37)
    assert b["recovery"] == 13.0  # the restart to every rank stepping (50)
    assert b["redone"] == 5.0  # 50 to step 21 (55): steps 16-20 again
    assert b["start-up"] == 10.0 and b["end"] == pytest.approx(80.0 - 74.0)
    [inc] = out["incidents"]
    assert (inc["what"], inc["action"], inc["node"], inc["rank"]) == ("stall", "restart",
                                                                     "node1", 1)
    assert (inc["detect_s"], inc["decide_s"], inc["act_s"], inc["recover_s"]) == (
        6.0, 1.0, 1.0, 13.0)
    assert inc["steps_redone"] == 5
    assert inc["gpu_hours_lost"] == pytest.approx(2 * (8 + 13 + 5) / 3600, abs=1e-5)


def test_a_nodes_clock_is_put_on_the_judges_by_its_ranks_stall():
    out = stalled_and_restarted(skew=100.0).report()  # node1's host 100 s ahead
    assert out["buckets"]["stalled"] == 8.0 and out["buckets"]["redone"] == 5.0
    assert out["wall_s"] == 80.0  # node1's launch at 100 on its clock is 0 on the judge's


def test_an_action_with_no_stall_is_an_incident_with_no_detection():
    run = Run()
    run.steps(1, 20, 10.0)
    run.judge("restarted", 31.0, node="node0", reason="asked by a console")
    for node in ("node0", "node1"):
        run.node(node, {"k": "file", "f": 4, "rank": 0 if node == "node0" else 1})
    run.steps(21, 30, 40.0, f=4)
    run.judge("stepping", 40.0, node="node0", rank=0, step=21)
    run.judge("stepping", 40.0, node="node1", rank=1, step=21)
    run.end(50.0)
    out = run.report()
    [inc] = out["incidents"]
    assert inc["what"] == "restart" and inc["detect_s"] is None and inc["recover_s"] == 9.0
    assert out["buckets"]["recovery"] == 9.0 and out["buckets"]["stalled"] == 0.0


def test_work_at_risk_is_gpu_hours_since_the_newest_complete_checkpoint():
    run = Run()
    run.steps(1, 60, 10.0)
    run.node("node0", {"k": "ckpt", "step": 40, "path": "/c/40", "f": 2}, 49.5)
    run.node("node0", {"k": "ckpt", "step": 50, "path": "/c/50", "f": 2}, 59.5)
    run.node("node0", {"k": "ckpt_done", "step": 40, "path": "/c/40", "complete": True}, 51.0)
    out = run.report(now=109.5)  # the run goes on; checkpoint 50 is not complete yet
    assert not out["ended"] and out["wall_s"] == 109.5
    assert out["work_at_risk_gpu_h"] == pytest.approx(2 * 60.0 / 3600, abs=1e-4)
    run.node("node0", {"k": "ckpt_done", "step": 50, "path": "/c/50", "complete": True}, 61.0)
    assert run.report(now=109.5)["work_at_risk_gpu_h"] == pytest.approx(2 * 50 / 3600, abs=1e-4)


def test_nothing_yet_is_no_figure():
    out = Goodput().report(now=10.0)
    assert out["goodput"] is None and out["wall_s"] == 0.0 and out["incidents"] == []


def test_the_console_says_it_in_status_the_header_and_the_report(tmp_path):
    from console.model.state import RunState
    from console.records.report import RunReport
    from console.tui.header import RunHeader

    state = RunState("r1", [("node0", "h0"), ("node1", "h1")])
    run = stalled_and_restarted()
    state.goodput = run.g
    status = state.status(now=100.0)
    assert status["goodput"]["incidents"][0]["steps_redone"] == 5
    assert status["goodput"]["buckets"]["stalled"] == 8.0
    live = Run()
    live.steps(1, 60, 10.0)
    live.node("node0", {"k": "ckpt", "step": 50, "path": "/c/50", "f": 2}, 59.5)
    live.node("node0", {"k": "ckpt_done", "step": 50, "path": "/c/50", "complete": True}, 61.0)
    state.goodput = live.g
    header = RunHeader(state, clock=lambda: 109.5).info().plain  # the run goes on
    assert "goodput 91%, at risk 0.028 GPU-h" in header, header  # 99.5 s of 109.5
    state.goodput = run.g
    page = RunReport(state).markdown("loss.svg")
    assert "## Goodput" in page and "| stalled | 0:00:08 |" in page, page
    assert "stall rank 1 on node1 step 20 -> restart: detect 6.0 s, decide 1.0 s, act 1.0 s, " \
           "recover 13.0 s; 5 steps redone" in page.replace("\\", "").replace("&gt;", ">"), page


def test_a_hosts_odd_values_are_left_out():
    run = Run()
    run.steps(1, 11, 10.0)
    for bad in (float("nan"), float("inf"), "12", True, None):
        run.node("node0", {"k": "metric", "step": 12, "f": 2, "ts": bad})
        run.judge("stalled", 35.0, node={"x": 1}, rank="1\x1b[31m", step=bad, idle_s=bad)
    run.node("node0", {"k": "metric", "step": "13", "f": 2, "ts": 22.0})
    run.node("node0", {"k": "metric", "step": 2 ** 70, "f": 2, "ts": 22.5})  # no OverflowError
    run.end(25.0)
    out = run.report()
    assert out["buckets"]["start-up"] == 10.0 and out["buckets"]["end"] == 5.0
    assert out["incidents"][0]["node"] is None and out["incidents"][0]["rank"] is None
