"""Numbers a host sends are bounded where messages are checked (console/run/messages.py), and
the agent never parses a number the console would refuse (agent/formats/values.py,
agent/formats/metrics.py): one line of a training script must not cost a node its connection."""

from __future__ import annotations

import math

import pytest

from agent.wire import protocol
from agent.formats.metrics import MetricParser
from console.run import messages as agent_messages


def journal(*metas, end=10) -> bytes:
    return protocol.encode({"t": "journal", "end": end, "recs": [[m] for m in metas]})


FILE = {"k": "file", "f": 1, "rank": 0, "local_rank": 0, "world_size": 4, "stream": "stdout"}


@pytest.mark.parametrize("meta,end,reason", [
    ({"k": "metric", "f": 1, "step": 10 ** 20}, 10, "step = 100000000000000000000"),
    ({"k": "metric", "f": 1, "step": 2 ** 62}, 10, "step = 4611686018427387904"),
    ({"k": "metric", "f": 1, "step": -1}, 10, "step = -1"),
    ({"k": "metric", "f": 1, "lr": float("inf")}, 10, "lr = inf"),
    ({"k": "metric", "f": 1, "tok_s": float("nan")}, 10, "tok_s = nan"),
    ({"k": "metric", "f": 1, "ts": 1e300}, 10, "ts = 1e+300"),
    ({"k": "metric", "f": 1, "ts": float("inf")}, 10, "ts = inf"),
    ({"k": "metric", "f": 1, "ts": float("nan")}, 10, "ts = nan"),
    ({"k": "metric", "f": 1}, -5, "end = -5"),
    (dict(FILE, rank=-7), 10, "rank = -7"),
    (dict(FILE, rank=10 ** 30), 10, "rank = 1000000000000000000000000000000"),
    (dict(FILE, world_size=-1), 10, "world_size = -1"),
    (dict(FILE, world_size=0), 10, "world_size = 0"),
    (dict(FILE, world_size=2 ** 21), 10, "world_size = 2097152"),
    (dict(FILE, rank=4), 10, "rank 4 in a world of 4"),
    ({"k": "event", "what": "worker_failed", "exit_code": 2 ** 40}, 10, "exit_code"),
    ({"k": "ckpt", "step": 5, "bytes": float("inf")}, 10, "bytes = inf"),
    # a loss may be inf or NaN (a diverged run), not an int no float can hold: the chart's
    # and the table's float conversions raised OverflowError on it
    ({"k": "metric", "f": 1, "loss": 10 ** 400}, 10, "loss = 1000000000"),
])
def test_numbers_out_of_bounds_are_refused_with_the_reason(meta, end, reason):
    with pytest.raises(protocol.ProtocolError) as err:
        agent_messages.parse(journal(meta, end=end))
    assert reason in str(err.value), str(err.value)


def test_numbers_within_bounds_pass_and_a_loss_may_be_inf_or_nan():
    msg = agent_messages.parse(journal(
        FILE, {"k": "metric", "f": 1, "step": 2 ** 62 - 1, "loss": float("nan"), "ts": 1.7e9},
        {"k": "metric", "f": 1, "step": 3, "loss": float("-inf"), "lr": 3e-4},
        {"k": "event", "what": "worker_failed", "rank": 3, "exit_code": -9}))
    assert math.isnan(msg["recs"][1][0]["loss"]) and msg["recs"][3][0]["exit_code"] == -9


def test_a_state_with_a_wrong_shape_is_refused():
    for state, reason in [({"state": "running", "cause": "boom"}, "cause that is 'boom'"),
                          ({"state": "running", "exit_code": 2 ** 40}, "exit_code"),
                          ({"state": "running", "restarts": -1}, "restarts = -1")]:
        with pytest.raises(protocol.ProtocolError) as err:
            agent_messages.parse(protocol.encode({"t": "state", "state": state}))
        assert reason in str(err.value)


@pytest.mark.parametrize("op,data,reason", [
    ("state", {"state": "running", "journal_size": -4}, "journal_size = -4"),
    ("state", {"state": "running", "alive": "yes"}, "alive = 'yes'"),
    ("restart", {"state": "missing"}, "unknown state 'missing'"),
    ("subscribe", {"sub": "node0"}, "offset no value"),
    ("store_start", {"pid": 5, "port": 70000, "addr": "a"}, "port = 70000"),
    ("probe_tcp", {"ok": "yes"}, "ok = 'yes'"),
    ("scrollback", {"recs": [[{"k": "data", "f": 1, "o": -1}, "x"]], "start": 0}, "o = -1"),
    ("why", {"ranks": [{"pid": 3, "rank": 0, "stack": ["x"]}]}, "stack = ['x']"),
    ("why", {"ranks": "all"}, "ranks = 'all'"),
    ("ping", [1], "not an object"),
])
def test_every_answer_has_a_shape(op, data, reason):
    with pytest.raises(protocol.ProtocolError) as err:
        agent_messages.check_answer(op, data)
    assert reason in str(err.value), str(err.value)


def test_well_formed_answers_pass():
    agent_messages.check_answer("state", {"state": "missing", "journal_size": 0})
    agent_messages.check_answer("stop", {"state": "stopped", "left": [], "alive": False,
                                         "exit_code": -15, "cause": {"message": "m", "rank": 1}})
    agent_messages.check_answer("why", {"ranks": [{"pid": 3, "rank": 0, "stack": "s",
                                                   "sources": {}, "fr": {"error": "x"}}]})
    agent_messages.check_answer("store_start", {"pid": 5, "port": 29500, "addr": "10.0.0.1"})
    agent_messages.check_answer("runs", {"runs": []})


def test_the_agent_drops_what_the_console_would_refuse():
    parser = MetricParser()
    recs = parser.parse("step=100000000000000000000 loss=1.0 lr=inf tok/s=1e400\n")
    metrics = [r for r in recs if r["k"] == "metric"]
    assert metrics, recs
    for rec in metrics:
        assert "step" not in rec or rec["step"] is None, rec
        assert "lr" not in rec and "tok_s" not in rec, rec
        agent_messages.parse(journal(FILE, dict(rec, f=1)))  # the console takes it
    nan = [r for r in parser.parse("step=9 loss=nan\n") if r["k"] == "metric"]
    assert nan and nan[0]["step"] == 9 and math.isnan(nan[0]["loss"])
