"""The judge's rules added for a run nobody watches (agent/rules/judge.py, over the RunView of
agent/rules/judge_view.py): a rendezvous that waits and for whom, a run whose ranks print no steps
stalling on their CPU, a node in trouble again soon after its restart proposed for cordon. Plain
data in, events out; the judge process with real sockets is tests/agent/test_judge.py, real
torchrun tests/spine/test_judge*.py."""

from __future__ import annotations

from agent.rules.judge import check_stalls, check_waiting, cordon_proposal
from agent.rules.judge_view import RunView

HOST = 1_764_000_000.0  # a host's clock, far from the judge's (seconds since it started)


def state(name, rnd, note=None, since=HOST, sent=None, node_state="running"):
    return {"state": node_state, "sent": HOST + 1 if sent is None else sent,
            "phase": {"name": name, "round": rnd, "note": note, "since": since}}


def test_a_rendezvous_past_the_threshold_names_the_node_it_waits_for_once_then_ends():
    view = RunView(["node0", "node1"], 5)
    # node0 entered round 3 one second before its link sent it (host clock): judge time 99
    view.apply_state("node0", state("rendezvous", 3, "waiting", since=HOST), 100)
    view.apply_state("node1", state("workers running", 2, since=HOST - 50), 100)
    assert view.nodes["node0"].phase["since"] == 99
    assert check_waiting(view, 103) == []  # young: a restart takes that long
    events = check_waiting(view, 105)
    assert [e["what"] for e in events] == ["waiting"], events
    wait = events[0]
    assert [m["node"] for m in wait["missing"]] == ["node1"], wait
    assert (wait["round"], wait["joined"], wait["nodes"], wait["in"]) == (3, 1, 2, ["node0"])
    assert wait["waited_s"] == 6
    assert "not joined: node1 (running; torchrun workers running (round 2))" in wait["text"]
    assert check_waiting(view, 106) == []  # said once, not every second
    view.apply_state("node1", state("rendezvous", 3, "waiting", since=HOST + 8,
                                    sent=HOST + 9), 108)
    view.apply_state("node0", state("workers running", 3, since=HOST + 9, sent=HOST + 9), 108)
    view.apply_state("node1", state("workers running", 3, since=HOST + 9, sent=HOST + 9), 108)
    over = check_waiting(view, 109)
    assert [e["what"] for e in over] == ["waiting over"] and "round 3" in over[0]["text"]
    assert view.waiting is None


def test_a_phase_without_the_hosts_clock_is_timed_from_when_the_judge_heard_of_it():
    view = RunView(["node0", "node1"], 5)
    old = {"state": "running", "phase": {"name": "rendezvous", "round": 1, "since": 0.5}}
    view.apply_state("node0", old, 100)  # an older link: no `sent`
    view.apply_state("node0", dict(old, state="running"), 104)  # the same phase again
    assert view.nodes["node0"].phase["since"] == 100
    assert check_waiting(view, 104) == []
    assert [e["what"] for e in check_waiting(view, 106)] == ["waiting"]
    # a phase a host made up is not believed (agent/rules/rendezvous.py phase_of)
    view.apply_state("node1", {"state": "running", "phase": {"name": "rm -rf /"}}, 106)
    assert view.nodes["node1"].phase is None


def sample(node_ranks, cpu, period=1.0):
    """One node's sample (agent/supervisor/ranksample.py): its ranks have entered collective 7."""
    return {"k": "sample", "ts": HOST, "tick": 1, "period": period,
            "ranks": [{"rank": r, "pid": 100 + r, "cpu_s": cpu, "state": "S",
                       "fr": [["0", 7, 1000]]} for r in node_ranks]}


def test_a_run_that_prints_no_steps_stalls_when_no_ranks_cpu_advances_and_runs_again():
    view = RunView(["node0", "node1"], 5)
    view.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    view.apply("node1", {"k": "file", "f": 1, "rank": 1}, 0)
    for t, cpu in enumerate((1.0, 2.0, 3.0)):  # busy: a core's worth every second
        view.apply("node0", sample([0], cpu), t)
        view.apply("node1", sample([1], cpu), t)
    for t in range(3, 8):  # then idle (both wait in a collective that never completes)
        view.apply("node0", sample([0], 3.0), t)
        view.apply("node1", sample([1], 3.0), t)
        assert check_stalls(view, t) == [], t  # not past 5 s with no CPU yet
    assert check_stalls(view, 30) == []  # samples are the evidence, not the judge's clock
    view.apply("node0", sample([0], 3.0), 8)
    stalls = check_stalls(view, 8)
    assert sorted(e["rank"] for e in stalls) == [0, 1], stalls
    assert all("no rank's CPU has advanced" in e["text"] for e in stalls)
    assert check_stalls(view, 9) == []  # said once
    back = view.apply("node1", sample([1], 4.0), 10)  # one rank's CPU moves: the run runs
    assert sorted(e["rank"] for e in back if e["what"] == "stepping") == [0, 1], back


def test_a_rank_whose_cpu_never_advanced_is_not_stalled_by_it():
    view = RunView(["node0"], 5)
    view.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    view.apply("node0", sample([0], 1.0), 0)
    view.apply("node0", sample([0], 2.0), 1)  # rank 0 busy once
    view.apply("node0", {"k": "file", "f": 2, "rank": 1}, 2)  # rank 1 starts, never busy
    view.apply("node0", sample([0, 1], 2.0), 20)
    stalls = check_stalls(view, 20)
    assert [e["rank"] for e in stalls] == [0], stalls
    # a run whose ranks print steps is judged on its steps, not on CPU
    stepping = RunView(["node0"], 5)
    stepping.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    stepping.apply("node0", sample([0], 1.0), 0)
    stepping.apply("node0", sample([0], 2.0), 1)
    stepping.apply("node0", {"k": "metric", "f": 1, "step": 1}, 18)
    assert check_stalls(stepping, 20) == []


def restarted(view, node, at):
    view.apply(node, {"k": "event", "what": "restarting"}, at - 5)
    # the old workers killed for the restart are no trouble of the new ones
    assert view.apply(node, {"k": "event", "what": "worker_failed", "rank": 1,
                             "exit_code": -15}, at - 4) == []
    view.apply(node, {"k": "event", "what": "launched", "launch": 2}, at)


def test_a_node_failing_again_soon_after_its_restart_is_proposed_for_cordon_once():
    view = RunView(["node0", "node1"], 5, cordon_within_s=600)
    failed = {"k": "event", "what": "worker_failed", "rank": 1, "exit_code": -6}
    assert view.apply("node1", failed, 50) == []  # never restarted: bad luck, not the node
    restarted(view, "node1", 100)
    proposed = view.apply("node1", failed, 160)
    assert [(e["what"], e["node"]) for e in proposed] == [("cordon proposed", "node1")]
    assert "killed by SIGABRT" in proposed[0]["reason"]
    assert proposed[0]["since_restart_s"] == 60
    assert "node1 proposed for cordon" in proposed[0]["text"]
    assert view.apply("node1", failed, 170) == []  # once per restart
    restarted(view, "node1", 1000)
    assert view.apply("node1", failed, 1700) == []  # long after the restart: not again soon
    assert cordon_proposal(view, "node0", "the verdict names rank 0", 1700) == []


def test_a_verdict_naming_a_node_soon_after_its_restart_proposes_it_and_0_turns_it_off():
    view = RunView(["node0", "node1"], 5, cordon_within_s=600)
    restarted(view, "node0", 10)
    proposed = cordon_proposal(view, "node0", "the verdict names rank 0 (stuck-in-python)", 70)
    assert proposed and proposed[0]["reason"].startswith("the verdict names rank 0")
    off = RunView(["node0"], 5, cordon_within_s=0)
    restarted(off, "node0", 10)
    assert cordon_proposal(off, "node0", "the verdict names rank 0", 20) == []


def test_a_failure_that_echoes_another_nodes_is_not_the_restarted_nodes_trouble():
    """Restarting node0 makes node1's workers fail in their collectives too: node1, restarted
    a while ago, is not proposed for that; its own failure later is."""
    view = RunView(["node0", "node1"], 5, cordon_within_s=600)
    restarted(view, "node1", 100)
    view.apply("node0", {"k": "event", "what": "restarting"}, 200)
    echo = {"k": "event", "what": "worker_failed", "rank": 1, "exit_code": 1}
    assert view.apply("node1", echo, 203) == []
    assert [e["node"] for e in view.apply("node1", echo, 300)] == ["node1"]


def test_figures_no_float_can_hold_are_left_out_of_the_stall_threshold_and_the_metrics():
    # a node's record may carry 10**400 (JSON writes it out in digits): before, the stall
    # threshold's median times a float, and the Prometheus figure's isnan, raised OverflowError
    from agent.judge.figures import _number
    from agent.rules.judge import stall_threshold

    view = RunView(["node0"], 5)
    view.apply("node0", {"k": "file", "f": 1, "rank": 0}, 0)
    for step, step_time in ((1, 0.5), (2, 10 ** 400), (3, -1.0), (4, 0.5)):
        view.apply("node0", {"k": "metric", "f": 1, "step": step, "step_time": step_time}, step)
    assert list(view.ranks[0].step_times) == [0.5, 0.5]
    assert stall_threshold(view.ranks[0], 5) == 5
    assert _number(10 ** 400) is None and _number(10 ** 400, nan_ok=True) is None
    assert _number(float("inf"), nan_ok=True) == float("inf") and _number(3) == 3
