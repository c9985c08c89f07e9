"""Who else watches a run, who drives it, and their actions as events (console/model/consoles.py).

The agents' ``consoles`` and ``actions`` messages are host text: a record of the wrong shape
is dropped, texts are cleaned; another console's action is an event, this console's own is
not (it showed it already); a resubscription resumes the log where it stopped.
"""

from console.model.consoles import Me, Operators, action_line, action_record
from console.model.state import RunState


def console(who, cid, role="drive", since=1.0):
    return {"who": who, "console": cid, "role": role, "since": since, "login": "train"}


def operators(read_only=False) -> Operators:
    return Operators(me=Me("bob@laptop", "b", read_only=read_only, attach=True))


def test_the_newest_driving_console_drives_and_the_header_says_so():
    ops = operators(read_only=True)
    assert ops.summary() == "READ-ONLY"  # nothing listed yet
    ops.apply_consoles("node0", [console("alice@laptop", "a", since=1.0),
                                 console("bob@laptop", "b", "watch", since=2.0)])
    ops.apply_consoles("node1", [console("carol@laptop", "c", since=3.0),
                                 console("alice@laptop", "a", since=1.0)])
    assert [c["who"] for c in ops.attached()] == ["alice@laptop", "bob@laptop", "carol@laptop"]
    assert ops.driver()["who"] == "carol@laptop"
    assert ops.summary() == "READ-ONLY · 3 consoles · carol@laptop drives"
    ops.apply_consoles("node1", [])  # carol left (and alice's line on node1 with her)
    assert ops.summary() == "READ-ONLY · 2 consoles · alice@laptop drives"
    ops.apply_consoles("node0", [console("bob@laptop", "b", "watch")])
    assert ops.summary() == "READ-ONLY · 1 console · nobody drives"


def test_a_console_alone_that_drives_says_nothing():
    ops = operators()
    ops.apply_consoles("node0", [console("bob@laptop", "b")])
    assert ops.summary() == ""
    ops.apply_consoles("node1", [console("alice@laptop", "a", since=5.0)])
    assert ops.summary() == "2 consoles · alice@laptop drives"
    ops.apply_consoles("node1", [console("bob@laptop", "b"),
                                 console("alice@laptop", "a", "watch", since=5.0)])
    assert ops.summary() == "2 consoles · you drive"


def test_other_consoles_actions_are_events_and_own_ones_are_not():
    state = RunState("r1", [("node0", "127.0.0.2"), ("node1", "127.0.0.3")])
    state.operators = ops = operators()
    recs = [{"ts": 100.0, "took_s": 1.5, "action": "restart", "node": "node1",
             "who": "alice@laptop", "console": "a", "login": "train", "result": "ok"},
            {"ts": 101.0, "action": "stop", "node": "node1", "who": "bob@laptop",
             "console": "b", "login": "train", "result": "ok"}]
    ops.apply_actions("node1", recs, 321, state.add_event)  # the first: the log so far
    assert not state.events and len(ops.actions) == 2
    ops.apply_actions("node1", recs, 642, state.add_event)  # as they happen
    assert [(e.node, e.kind, e.text, e.ts) for e in state.events] == [
        ("node1", "action", "alice@laptop (login train) restarted node1: ok", 100.0)]
    assert len(ops.actions) == 4 and ops.actions_from == {"node1": 642}


def test_malformed_records_are_dropped_and_texts_cleaned():
    state = RunState("r1", [("node0", "127.0.0.2")])
    ops = operators()
    ops.apply_actions("node0", [], 0, state.add_event)  # the log so far: empty
    bad = [5, None, {"action": "stop"}, {"ts": "soon", "action": "stop"},
           {"ts": True, "action": "stop"}, {"ts": 1.0, "action": ["stop"]}, {"ts": 1e300,
                                                                           "action": "stop"}]
    hostile = {"ts": 2.0, "action": "stop", "node": "node0", "who": "\x1b[31mmallory\x1b[0m",
               "result": "ok\x07", "console": "m"}
    ops.apply_actions("node0", bad + [hostile], 99, state.add_event)
    assert [e.text for e in state.events] == ["mallory stopped node0: ok\ufffd"]  # BEL shown
    ops.apply_actions("node0", "not a list", 120, state.add_event)  # ignored, offset kept
    ops.apply_actions("node0", [], "120", state.add_event)
    assert ops.actions_from == {"node0": 99}
    ops.apply_consoles("node0", [7, {"who": "\x1b]0;x\x07eve", "role": "root", "since": "x"}])
    assert ops.attached() == [{"who": "eve", "console": "", "login": "", "role": "drive",
                               "since": 0.0}]


def test_an_action_in_words():
    rec = action_record({"ts": 1.0, "action": "cordon", "node": "node2", "who": "a@b",
                         "login": "train", "result": "read-only: refused", "detail": "spare"})
    assert action_line(rec) == "a@b (login train) cordoned node2 (spare): read-only: refused"
    assert action_line(action_record({"ts": 1.0, "action": "rekey"})) == "? rekey the run: ?"


def test_rankdeck_actions_lines_mask_the_runs_secrets():
    from console.records.actions import action_rows
    from console.lines.sanitize import Masker

    rec = action_record({"ts": 1.0, "action": "restart", "node": "node1", "who": "a@b",
                         "login": "train", "result": "agent: token hunter2 refused\x1b[2J"})
    [line] = action_rows([rec], Masker(["hunter2"]))
    assert line.endswith("  node1      a@b (login train) restarted node1: agent: token **** "
                         "refused"), line
    assert action_rows([], Masker([]))[0].startswith("no actions recorded")


def test_the_actions_kept_in_memory_are_bounded_newest_last():
    # a host's log is untrusted: a flood of lines must not grow the console without end
    from console.model.consoles import MAX_ACTIONS
    state = RunState("r1", [("node0", "127.0.0.2")])
    state.operators = ops = operators()
    recs = [{"ts": float(i), "action": "signal", "node": "node0", "who": "w", "console": "c",
             "login": "train", "result": "refused"} for i in range(MAX_ACTIONS + 500)]
    ops.apply_actions("node0", recs, 1, state.add_event)
    assert len(ops.actions) == MAX_ACTIONS
    assert ops.actions[0]["ts"] == 500.0 and ops.actions[-1]["ts"] == MAX_ACTIONS + 499.0
