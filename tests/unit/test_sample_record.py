"""A `sample` record (agent/supervisor/ranksample.py) from a broken or hostile agent: every malformed
field is refused with the reason before the straggler and CPU rules see it; a well-formed one,
as the agent writes it, passes. Through a real link, the node shows the protocol error and
reconnects, as for every other malformed record (tests/unit/test_protocol_errors.py)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from agent.wire.protocol import ProtocolError
from console.run import messages as agent_messages

from test_protocol_errors import broken_link  # tests/unit is on sys.path (no package)

GOOD = {"k": "sample", "ts": 1720000001.02, "tick": 172000000, "period": 10.0, "ranks": [
    {"rank": 0, "pid": 4242, "cpu_s": 12.5, "state": "S", "cpu_after_s": 12.61,
     "fr": [["0", 17, 1720000000990123], ["1", 3, 1720000000991000]]},
    {"rank": 1, "pid": 4243, "cpu_s": None, "state": "?",
     "fr_error": "the rank did not answer within 3 s"},
]}


def line(meta: dict) -> bytes:
    return json.dumps({"t": "journal", "end": 10, "recs": [[meta]]}).encode() + b"\n"


def changed(path: str, value) -> dict:
    """GOOD with the field at ``path`` ("ranks.0.cpu_s") set to ``value`` (or removed)."""
    meta = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    obj = meta
    for part in parents:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    if value is REMOVE:
        del obj[last]
    elif isinstance(obj, list):
        obj[int(last)] = value
    else:
        obj[last] = value
    return meta


REMOVE = object()


def test_a_sample_as_the_agent_writes_it_passes():
    msg = agent_messages.parse(line(GOOD))
    assert msg["recs"][0][0]["ranks"][1]["cpu_s"] is None
    agent_messages.parse(line(changed("ranks", [])))  # a node between restarts


@pytest.mark.parametrize("path,value,reason", [
    ("tick", REMOVE, "tick no value"),
    ("tick", "172000000", "tick = '172000000'"),
    ("tick", -1, "tick = -1"),
    ("tick", 1.5, "tick = 1.5"),
    ("tick", True, "tick = True"),
    ("tick", 2 ** 63, "not a whole number from 0"),
    ("ts", float("nan"), "ts = nan"),
    ("ts", float("inf"), "ts = inf"),
    ("period", 0, "period = 0, not more than 0"),
    ("period", -10, "period = -10"),
    ("period", REMOVE, "period no value"),
    ("ranks", "all", "ranks = 'all', not a list"),
    ("ranks", [{}] * 1025, "not a list of at most 1024"),
    ("ranks.0", 5, "ranks[0] is 5, not an object"),
    ("ranks.0.rank", REMOVE, "ranks[0] has rank no value"),
    ("ranks.0.rank", "0", "rank = '0'"),
    ("ranks.1.pid", -7, "ranks[1] has pid = -7"),
    ("ranks.0.cpu_s", float("nan"), "cpu_s = nan"),
    ("ranks.0.cpu_s", -1.0, "cpu_s = -1.0"),
    ("ranks.0.cpu_s", 10 ** 400, "cpu_s = 1000"),
    ("ranks.0.cpu_after_s", "12", "cpu_after_s = '12'"),
    ("ranks.0.state", 5, "state = 5, not text"),
    ("ranks.1.fr_error", {"why": 1}, "fr_error = {'why': 1}"),
    ("ranks.0.fr", "rows", "fr = 'rows', not a list"),
    ("ranks.0.fr", [["0", 1, 2]] * 4097, "not a list of at most 4096"),
    ("ranks.0.fr.0", ["0", 17], "fr entry ['0', 17]"),
    ("ranks.0.fr.0", [0, 17, 5], "fr entry [0, 17, 5]"),
    ("ranks.0.fr.0", ["0", 17, float("nan")], "fr entry ['0', 17, nan]"),
    ("ranks.0.fr.0", ["0", -17, 5], "fr entry ['0', -17, 5]"),
    ("ranks.0.fr.0", ["0", 17, 2 ** 70], "fr entry ['0', 17, 1180591620717411303424]"),
])
def test_a_malformed_sample_is_refused_with_the_reason(path, value, reason):
    with pytest.raises(ProtocolError) as err:
        agent_messages.parse(line(changed(path, value)))
    assert "'sample' record" in str(err.value) and reason in str(err.value), str(err.value)


def test_a_sample_with_nan_cpu_shows_a_protocol_error_on_the_node_and_reconnects():
    async def main():
        link, state, transport = await broken_link("sample-nan")
        cause = state.nodes["node0"].cause
        assert cause.startswith("protocol error: ") and "cpu_s = nan" in cause, cause
        assert state.rank_cpu.cpu_s(0) is None  # the rule never saw it
        assert transport.opened[0].proc.returncode is not None
        await link.close()
    asyncio.run(main())
