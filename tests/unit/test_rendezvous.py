"""What a run says while a rendezvous waits (console/model/rendezvous.py), on RunState fed as the
agents feed it: supervisor states with the torchrun phase a host reported."""

from __future__ import annotations

from console.model import rendezvous
from console.judgement.local_judge import check_waiting
from console.lines.sanitize import masker_for
from console.model.state import RunState

T0 = 1_000_000.0


def run_with(phases: dict) -> RunState:
    st = RunState("r1", [(name, "") for name in phases])
    for name, phase in phases.items():
        st.apply_supervisor_state(name, {"state": "running", "phase": phase})
    return st


def test_a_phase_from_a_host_keeps_known_names_and_numbers_and_masks_its_note():
    masker = masker_for(["hunter2-secret"])
    assert rendezvous.phase_of({"name": "rm -rf", "round": 1}) is None
    assert rendezvous.phase_of("rendezvous") is None
    phase = rendezvous.phase_of({"name": "rendezvous", "round": "3", "since": True,
                                 "note": "waiting \x1b[31mhunter2-secret"}, masker)
    assert phase["round"] is None and phase["since"] is None
    assert "hunter2-secret" not in phase["note"] and "\x1b" not in phase["note"]
    assert rendezvous.phase_text({"name": "assigning ranks", "round": 2, "rank": 1, "world": 4,
                                  "note": None}) == "assigning ranks (round 2, node rank 1 of 4)"


def test_a_rendezvous_older_than_the_threshold_names_who_has_not_joined():
    st = run_with({
        "node0": {"name": "rendezvous", "round": 3, "note": "waiting", "since": T0},
        "node1": {"name": "workers running", "round": 2, "since": T0 - 100},
        "node2": {"name": "rendezvous", "round": 3, "note": "waiting", "since": T0 + 1},
    })
    st.stall_min_s = 60
    assert check_waiting(st, T0 + 30) is None  # young: a restart takes that long
    wait = check_waiting(st, T0 + 75)
    assert (wait["round"], wait["joined"], wait["nodes"]) == (3, 2, 3)
    assert [m["node"] for m in wait["missing"]] == ["node1"]
    assert "node1 (starting; torchrun workers running (round 2))" in wait["text"]
    check_waiting(st, T0 + 80)
    assert [e.kind for e in st.events].count("waiting") == 1  # said once, not every second
    assert st.status(T0 + 80)["waiting_for"]["missing"][0]["node"] == "node1"
    assert st.status(T0 + 80)["nodes"][0]["phase"]["text"] == "rendezvous (round 3, waiting)"


def test_a_restart_waits_for_a_young_rendezvous_but_not_for_an_old_one_or_a_dead_node():
    st = run_with({
        "node0": {"name": "rendezvous", "round": 1, "note": "waiting", "since": T0},
        "node1": {"name": "ended", "note": "exit 1", "since": T0},
    })
    st.nodes["node1"].state = "failed"
    nodes, ranks = st.nodes, list(st.ranks.values())
    refusal = rendezvous.restart_refusal(nodes, ranks, ["node0"], T0 + 10, 60)
    assert refusal.startswith("restart refused: node0 in a rendezvous (round 1)")
    assert rendezvous.restart_refusal(nodes, ranks, ["node1"], T0 + 10, 60) is None
    assert rendezvous.restart_refusal(nodes, ranks, ["node0"], T0 + 61, 60) is None


def test_beside_a_judge_the_console_says_the_wait_only_when_that_judge_does_not():
    """The judge applies the rule and lists it in its `judge` event (console/judgement/judged.py); a
    console beside an older judge, which lists no rules, applies it itself."""
    from console.judgement.local_judge import beside_judge
    phases = {"node0": {"name": "rendezvous", "round": 3, "note": "waiting", "since": T0},
              "node1": {"name": "workers running", "round": 2, "since": T0 - 100}}
    for rules, said in ((["stalls", "waiting", "cpu"], 0), ([], 1)):
        st = run_with(phases)
        st.stall_min_s = 60
        st.judge = {"rules": rules}
        beside_judge(st, T0 + 75)
        assert [e.kind for e in st.events].count("waiting") == said, rules
