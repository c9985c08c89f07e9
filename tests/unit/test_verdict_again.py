"""A verdict that named nobody is taken again while the stall goes on (agent/rules/judge.py
``verdict_again_due``, applied to RunState by console/judgement/local_judge.py): on a loaded host the first two samples may still see ranks entering
collectives ("no hang"), and a verdict taken once at the stall's start would then say
nothing for the whole hang. Events only when the verdict changes."""

from agent.rules.judge import VERDICT_AGAIN_MAX_S, VERDICT_AGAIN_S
from console.judgement.local_judge import verdict_again_due
from console.model.state import RunState
from console.model.nodes import RankState

UNKNOWN = {"kind": "unknown", "suspects": [], "evidence": {},
           "summary": "no suspect: no hang: rank(s) 0-1 entered new collectives"}
MISMATCH = {"kind": "mismatch", "suspects": [{"rank": 1, "node": "n0", "frame": None}],
            "evidence": {}, "summary": "rank 1 entered another collective"}


def stalled_state() -> RunState:
    st = RunState("r", [("n0", "127.0.0.2")])
    for rank in (0, 1):
        st.ranks[rank] = RankState(rank=rank, node="n0", state="stalled")
    return st


def verdict_events(st: RunState) -> list[str]:
    return [e.text for e in st.events if e.kind == "verdict"]


def test_an_unknown_verdict_is_taken_again_with_growing_gaps_while_stalled():
    st = stalled_state()
    st.set_verdict(UNKNOWN)
    t0 = st.verdict_at
    assert not verdict_again_due(st, t0 + VERDICT_AGAIN_S - 1)
    assert verdict_again_due(st, t0 + VERDICT_AGAIN_S + 1)
    st.set_verdict(UNKNOWN)  # the same answer: no second event
    t1 = st.verdict_at
    assert len(verdict_events(st)) == 1
    assert not verdict_again_due(st, t1 + VERDICT_AGAIN_S + 1)  # the gap doubled
    assert verdict_again_due(st, t1 + 2 * VERDICT_AGAIN_S + 1)
    for _ in range(10):  # never further apart than the cap
        st.set_verdict(UNKNOWN)
        assert verdict_again_due(st, st.verdict_at + VERDICT_AGAIN_MAX_S + 1)

    st.set_verdict(MISMATCH)  # a named suspect: news, and no more looks
    assert verdict_events(st)[-1].startswith("mismatch")
    assert not verdict_again_due(st, st.verdict_at + 10 * VERDICT_AGAIN_MAX_S)


def test_no_second_look_once_the_ranks_step_again():
    st = stalled_state()
    st.set_verdict(UNKNOWN)
    for rs in st.ranks.values():
        rs.state = "running"
    assert not verdict_again_due(st, st.verdict_at + VERDICT_AGAIN_MAX_S + 1)
