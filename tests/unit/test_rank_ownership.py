"""Issue 29: a host can neither fill the console's memory with `file` records nor take a rank
another node still runs; ranks still move between nodes when torchrun hands them out again
(console/model/ownership.py). Records are fed the way a subscription feeds them."""

from __future__ import annotations

import asyncio
import json
import tracemalloc

import pytest

from agent.wire.protocol import ProtocolError
from console.run import messages as agent_messages
from console.run.link import NodeLink
from console.model.ownership import RANKS_PER_SLOT
from console.model.state import RunState
from inventory.model import Host

from test_protocol_errors import WAIT, BadAgentTransport  # tests/unit is on sys.path
from tests.waits import wait_for

NODES = [("node0", "10.0.0.1"), ("node1", "10.0.0.2")]
T0 = 1_700_000_000.0


def run_state() -> RunState:
    return RunState("r", NODES, slots={"node0": 1, "node1": 1})


def claim(state, node, fid, rank, instance="i0", attempt=0, size=2):
    state.apply_records(node, [[{"k": "file", "f": fid, "rank": rank, "local_rank": 0,
                                 "stream": "stdout", "attempt": attempt, "instance": instance,
                                 "path": "/r/%s/%d" % (node, fid), "world_size": size,
                                 "ts": T0 + fid}]], 0)


def line(state, node, fid, text):
    state.apply_records(node, [[{"k": "data", "f": fid, "o": 0, "ts": T0}, text + "\n"]], 0)


def test_a_node_cannot_take_a_rank_another_node_runs():
    state = run_state()
    claim(state, "node0", 1, 0, "a")
    claim(state, "node1", 1, 0, "b")  # node1's first attempt claims node0's live rank 0
    assert state.ranks[0].node == "node0"
    line(state, "node1", 1, "not rank 0's")
    state.apply_records("node1", [[{"k": "metric", "f": 1, "step": 99, "loss": 0.5}]], 0)
    assert state.ranks[0].lines.count == 0 and state.nodes["node1"].lines.count == 1
    assert state.ranks[0].step is None, "a held claim's metrics count for no rank"
    assert state.status()["nodes"][1]["ranks"] == []
    line(state, "node0", 1, "rank 0 says")
    assert state.ranks[0].node == "node0"


def test_ranks_swap_nodes_at_a_re_rendezvous_whatever_order_the_journals_come_in():
    """torchrun's new attempt gives node0 rank 1 and node1 rank 0; node1's journal is read
    first, while node0 still shows rank 0 in its older attempt."""
    state = run_state()
    claim(state, "node0", 1, 0)
    claim(state, "node1", 1, 1)
    claim(state, "node1", 2, 0, attempt=1)  # held: node0 runs rank 0 still
    assert state.ranks[0].node == "node0"
    claim(state, "node0", 2, 1, attempt=1)  # node0 moved on: both ranks move
    assert (state.ranks[0].node, state.ranks[1].node) == ("node1", "node0")
    line(state, "node1", 2, "rank 0 on node1")
    assert state.ranks[0].lines.count == 1


def test_a_rank_moves_from_a_node_that_ended_or_restarted():
    state = run_state()
    claim(state, "node0", 1, 0)
    claim(state, "node1", 1, 0, "b")
    assert state.ranks[0].node == "node0"
    state.apply_records("node0", [[{"k": "event", "what": "ended", "state": "stopped"}]], 0)
    assert state.ranks[0].node == "node1", "node0 ended: its rank went to node1's claim"
    state2 = run_state()
    claim(state2, "node0", 1, 0, "a")
    claim(state2, "node0", 2, 1, "b")  # a new torchrun on node0 (a rankdeck restart)
    claim(state2, "node1", 1, 0, "c")
    assert state2.ranks[0].node == "node1"


def test_a_node_that_claims_more_ranks_than_it_runs_is_a_protocol_error():
    state = run_state()
    for rank in range(RANKS_PER_SLOT):
        claim(state, "node0", rank + 1, rank, size=100)
    with pytest.raises(ProtocolError, match="more than 4 ranks"):
        claim(state, "node0", 99, 50, size=100)
    # a node with 8 slots may have 8 workers (and --nproc-per-node beyond its slots too)
    state = RunState("r", NODES, slots={"node0": 8})
    state.nproc = 16
    for rank in range(16):
        claim(state, "node0", rank + 1, rank, size=16)
    assert len(state.ranks) == 16


def test_one_message_of_new_ranks_stays_small():
    """One 16 MiB message of `file` records with new ranks once kept a RankState each (about
    1.2 GB); now the node is refused after its bound, with little kept."""
    recs = [[{"k": "file", "f": i, "rank": i, "world_size": 2 ** 20, "attempt": i,
              "instance": "x", "stream": "stdout"}] for i in range(1, 20001)]
    msg = agent_messages.parse(json.dumps({"t": "journal", "end": 1, "recs": recs}).encode())
    state = run_state()
    tracemalloc.start()
    try:
        state.apply_records("node0", msg["recs"], msg["end"])  # a new attempt each: allowed
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the ranks of older attempts nobody runs are forgotten; files of old attempts too
    assert len(state.ranks) <= 2 * RANKS_PER_SLOT
    assert len(state.nodes["node0"].files) <= 4 * RANKS_PER_SLOT
    assert peak < 64 << 20, peak
    same = [[{"k": "file", "f": i, "rank": i, "world_size": 2 ** 20, "attempt": 0,
              "instance": "y", "stream": "stdout"}] for i in range(30001, 30100)]
    with pytest.raises(ProtocolError):
        state.apply_records("node0", same, 2)
    assert len(state.ranks) <= 2 * RANKS_PER_SLOT


def test_unannounced_files_are_not_kept_one_by_one():
    state = run_state()
    state.apply_records("node0", [[{"k": "data", "f": i, "o": 0}, "x\n"] for i in range(1500)], 1)
    assert len(state.nodes["node0"].files) == 0
    assert state.nodes["node0"].lines.count == 1500


def test_a_node_claiming_too_many_ranks_shows_a_protocol_error_and_resumes_at_the_record():
    """Through a real link: the node shows `protocol error` and reconnects; the records
    before the refused one are kept once."""
    async def main():
        state = RunState("r1", [("node0", "127.0.0.2")], slots={"node0": 1})
        transport = BadAgentTransport("ranks-flood")
        link = NodeLink(Host("node0", "127.0.0.2"), transport, state, "/nowhere")
        await link.connect()
        await link.subscribe()
        await wait_for(lambda: "protocol error" in (state.nodes["node0"].cause or ""), WAIT,
                       "a protocol error on the node")
        cause = state.nodes["node0"].cause
        assert "claims more than 4 ranks" in cause, cause
        assert len(state.ranks) == 4
        assert state.nodes["node0"].journal_offset == 104  # the refused record's start
        await link.close()
    asyncio.run(main())
