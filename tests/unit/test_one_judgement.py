"""One judgement (docs/DESIGN-NOTES.md, "One judgement"): the run's rules are written once, in
agent/rules/judge.py. The judge applies them to its RunView (agent/rules/judge_view.py); a console
with no judge applies the same functions to its RunState (console/judgement/local_judge.py).
Fed the same records, both sides say the same: who stalls (and in what words), what a
rendezvous waits for, which nodes to stop at the run's end. Beside an older judge the console
applies only the rules that judge does not list, with the same functions."""

from __future__ import annotations

import pytest

from agent.rules import judge as rules
from agent.rules.judge_view import RunView
from console.judgement import local_judge
from console.model.state import RunState

T0 = 1_700_000_000.0


class BothSides:
    """The same records and node states into the judge's RunView and a console's RunState,
    each the way its side is fed (the judge's clock: when a record arrived, here its ts)."""

    def __init__(self, nodes, spares=(), stall_after=60.0):
        self.view = RunView(nodes, stall_after, 0)  # no cordon proposals: a console has none
        self.state = RunState("r", [(n, "") for n in list(nodes) + list(spares)],
                              stall_min_s=stall_after)
        for spare in spares:
            self.state.set_role(spare, "spare")

    def record(self, node, meta):
        self.view.apply(node, meta, meta["ts"])
        self.state.apply_records(node, [[meta]], 0)

    def node_state(self, node, st):
        self.view.apply_state(node, st)  # the host's own clock, as RunState keeps it
        self.state.apply_supervisor_state(node, st)

    def judge_stalls(self, now):
        return sorted((e["node"], e["rank"], e["text"]) for e in rules.check_stalls(self.view, now))

    def console_stalls(self, now):
        local_judge.check_stalls(self.state, now)
        return sorted((e.node, e.rank, e.text) for e in self.state.events if e.kind == "stalled")


def two_ranks(sides, silent_rank1=False):
    for node in ("node0", "node1"):
        sides.record(node, {"k": "event", "what": "launched", "pid": 1, "launch": 1, "ts": T0})
    for rank, node in ((0, "node0"), (1, "node1")):
        sides.record(node, {"k": "file", "f": 1, "rank": rank, "local_rank": 0,
                            "stream": "stdout", "attempt": 0, "instance": "i", "path": "p",
                            "world_size": 2, "ts": T0 + 1})
    for rank, node in ((0, "node0"), (1, "node1")):
        if rank == 0 or not silent_rank1:
            sides.record(node, {"k": "metric", "f": 1, "step": 5, "loss": 2.0, "step_time": 1.0,
                                "ts": T0 + 10})


def test_a_rank_of_a_node_that_ended_stalls_on_neither_side():
    """node1's state.json says it failed (its journal's `ended` record has not come, or never
    will): the judge does not stall its rank, and now neither does a console with no judge
    (its own copy stalled it)."""
    sides = BothSides(["node0", "node1"])
    two_ranks(sides)
    sides.node_state("node1", {"state": "failed", "cause": {"message": "boom"}})
    judge = sides.judge_stalls(T0 + 71)
    assert [(node, rank) for node, rank, _ in judge] == [("node0", 0)], judge
    assert sides.console_stalls(T0 + 71) == judge


def test_a_silent_rank_stalls_with_the_run_in_the_same_words_on_both_sides():
    sides = BothSides(["node0", "node1"])
    two_ranks(sides, silent_rank1=True)
    judge = sides.judge_stalls(T0 + 71)
    assert [rank for _, rank, _ in judge] == [0, 1], judge
    assert "prints no steps and the run has made none for 61 s" in judge[1][2]
    assert sides.console_stalls(T0 + 71) == judge
    # the run's next step wakes the silent rank on both sides
    sides.record("node0", {"k": "metric", "f": 1, "step": 6, "loss": 1.9, "ts": T0 + 80})
    assert sides.state.ranks[1].state == "running" == sides.view.ranks[1].state


def test_a_spare_is_not_waited_for_nor_keeps_a_finished_run_from_ending():
    """A spare is out of the run until a cordon puts it in: the judge's view has no such node,
    and the console's rules no longer count it: not a node the rendezvous waits for, and not
    a node that has not finished (the console never stopped a node restarted into a run that
    was over, when the run had a spare)."""
    sides = BothSides(["node0", "node1"], spares=["spare2"])
    sides.node_state("node0", {"state": "running", "phase": {"name": "rendezvous", "round": 3,
                                                            "note": "waiting", "since": T0}})
    sides.node_state("node1", {"state": "running", "phase": {"name": "workers running",
                                                            "round": 2, "since": T0 - 100}})
    waited = rules.check_waiting(sides.view, T0 + 75)[0]
    wait = local_judge.check_waiting(sides.state, T0 + 75)
    for key in ("round", "joined", "nodes", "in"):
        assert wait[key] == waited[key], key
    # (a node's state is each reducer's word: `starting` here until a rank of it steps)
    assert [m["node"] for m in wait["missing"]] == [m["node"] for m in waited["missing"]]
    assert [m["node"] for m in wait["missing"]] == ["node1"] and wait["nodes"] == 2

    sides = BothSides(["node0", "node1"], spares=["spare2"])
    two_ranks(sides)
    sides.record("node0", {"k": "metric", "f": 1, "step": 30, "loss": 2.0, "ts": T0 + 20})
    sides.record("node1", {"k": "metric", "f": 1, "step": 30, "loss": 2.0, "ts": T0 + 20})
    sides.node_state("node1", {"state": "running", "phase": {"name": "finished", "since": T0}})
    sides.record("node0", {"k": "event", "what": "worker_failed", "rank": 0, "local_rank": 0,
                           "exit_code": -6, "ts": T0 + 21})
    judge = rules.ends_due(sides.view)
    console = local_judge.ends_due(sides.state)
    assert {n: e["state"] for n, e in console.items()} == {"node0": "failed", "node1": "exited"}
    assert {n: e["state"] for n, e in judge.items()} == {n: e["state"] for n, e in console.items()}
    assert {n: e["text"] for n, e in judge.items()} == {n: e["say"] for n, e in console.items()}
    # who stopped it is the one difference: the judge, or rankdeck (this console)
    assert console["node0"]["cause"]["message"] == \
        judge["node0"]["cause"]["message"].replace("the judge stopped", "rankdeck stopped")


def cpu_sample(rank, cpu, ts):
    """A node's sample (agent/supervisor/ranksample.py): its rank is in collective 7."""
    return {"k": "sample", "ts": ts, "tick": 1, "period": 1.0,
            "ranks": [{"rank": rank, "pid": 100 + rank, "cpu_s": cpu, "state": "S",
                       "fr": [["0", 7, 1000]]}]}


def silent_run_whose_cpu_stopped(judge: dict | None) -> RunState:
    """Two ranks that print nothing, busy for 3 s then idle for 7 (threshold 5 s), and a
    rendezvous node0 has waited in for a minute; ``judge``: the run's judge as its `judge`
    event said."""
    st = RunState("r", [("node0", ""), ("node1", "")], stall_min_s=5)
    st.judge = judge
    for rank, node in ((0, "node0"), (1, "node1")):
        st.apply_records(node, [[{"k": "file", "f": 1, "rank": rank, "local_rank": 0,
                                  "stream": "stdout", "world_size": 2, "ts": T0}]], 0)
    for t, cpu in enumerate((1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0)):
        for rank, node in ((0, "node0"), (1, "node1")):
            st.apply_records(node, [[cpu_sample(rank, cpu, T0 + t)]], 0)
    st.apply_supervisor_state("node1", {"state": "running", "phase": {
        "name": "rendezvous", "round": 2, "note": "waiting", "since": T0 - 60}})
    return st


@pytest.mark.parametrize("listed, applied", [
    (list(rules.RULES), []),  # today's judge: the console applies nothing itself
    (["stalls", "waiting", "verdict", "finish"], ["cpu_stalls"]),  # a judge older than `cpu`
    ([], ["cpu_stalls", "check_waiting"]),  # a judge older than the list: stalls, verdicts, ends
])
def test_beside_an_older_judge_the_console_applies_what_it_does_not_list_with_the_same_rules(
        monkeypatch, listed, applied):
    calls = []
    for name in ("step_stalls", "cpu_stalls", "check_waiting", "verdict_again_due", "ends_due"):
        rule = getattr(rules, name)
        monkeypatch.setattr(rules, name, lambda *a, _rule=rule, _name=name, **k: (
            calls.append(_name), _rule(*a, **k))[1])
    st = silent_run_whose_cpu_stopped({"rules": listed})
    stalled = local_judge.beside_judge(st, T0 + 10)
    assert sorted(set(calls)) == sorted(applied), calls
    assert stalled == ("cpu_stalls" in applied)
    stalls = [e for e in st.events if e.kind == "stalled"]
    if "cpu_stalls" in applied:  # the judge's own words (agent/rules/rankcpu.py)
        assert [(e.rank, e.text) for e in stalls] == [
            (rank, rules.rankcpu.stall_text(rank, 7)) for rank in (0, 1)], stalls
        assert {r.state for r in st.ranks.values()} == {"stalled"}
    else:
        assert stalls == [] and {r.state for r in st.ranks.values()} == {"running"}
    waits = [e for e in st.events if e.kind == "waiting"]
    assert len(waits) == ("check_waiting" in applied), waits


def test_with_no_judge_the_console_applies_every_rule_it_can():
    st = silent_run_whose_cpu_stopped(None)
    assert local_judge.missing_rules(st) == local_judge.RULES
    stalled, again = local_judge.judge_locally(st, T0 + 10)
    assert sorted(rs.rank for rs in stalled) == [0, 1] and not again
    assert [e.kind for e in st.events].count("waiting") == 1
    assert st.status(T0 + 10)["waiting_for"]["missing"][0]["node"] == "node0"


def test_status_after_a_replay_reads_the_records_times_not_when_they_arrived():
    """`rankdeck status` replays the journals: every record arrives at once, now. The rules
    read when each was written (its host's `ts`, which RunState keeps), so a run whose last
    step was ten minutes ago is stalled for ten minutes, and one that stepped a second ago is
    not stalled at all."""
    import time
    for ago, state in ((600, "stalled"), (1, "running")):
        st = RunState("r", [("node0", "")], stall_min_s=60)
        start = time.time() - ago - 5
        st.apply_records("node0", [
            [{"k": "file", "f": 1, "rank": 0, "local_rank": 0, "stream": "stdout",
              "world_size": 1, "ts": start}],
            [{"k": "metric", "f": 1, "step": 7, "loss": 1.0, "ts": time.time() - ago}]], 0)
        local_judge.check_stalls(st)  # as console/verbs/recorded.py after its replay
        rank = st.status()["nodes"][0]["ranks"][0]
        assert rank["state"] == state, (ago, rank)
        assert rank["idle_s"] >= ago - 1, rank  # not the seconds since the replay


def test_a_ranks_field_the_judges_rules_read_is_a_field_of_the_consoles_rank_too():
    """The rules read a rank's fields under the judge's names (agent/rules/judge_view.py
    RankView); a console with no judge hands them RunState's RankState: a field added to
    one reducer's rank and not the other's would leave one side's rule reading nothing."""
    from agent.rules.judge_view import RankView
    from console.model.nodes import RankState
    judge = set(vars(RankView(0, "node0")))
    console = set(vars(RankState(0, "node0")))
    assert judge - console == set()
    view = local_judge.StateView(RunState("r", [("node0", "")]))
    assert all(hasattr(view, name) for name in (
        "nodes", "ranks", "stall_after", "rank_cpu", "waiting", "verdict", "verdict_at",
        "verdict_tries"))


def test_a_stall_that_reaches_a_second_rank_later_begins_once_on_both_sides():
    """Rank 0 stalls; rank 1 steps on and stalls later in the same hang: a verdict for the
    first (a stall began), none for the second, on the judge's side and the console's."""
    sides = BothSides(["node0", "node1"], stall_after=60.0)
    two_ranks(sides)
    sides.record("node1", {"k": "metric", "f": 1, "step": 6, "step_time": 1.0, "ts": T0 + 40})
    first = rules.check_stalls(sides.view, T0 + 80)
    assert [e["rank"] for e in first] == [0] and rules.stall_began(sides.view, first)
    stalled_now, _again = local_judge.judge_locally(sides.state, T0 + 80)
    assert [r.rank for r in stalled_now] == [0]
    later = rules.check_stalls(sides.view, T0 + 110)
    assert [e["rank"] for e in later] == [1] and not rules.stall_began(sides.view, later)
    stalled_now, _again = local_judge.judge_locally(sides.state, T0 + 110)
    assert stalled_now == []  # the same stall: no second verdict
