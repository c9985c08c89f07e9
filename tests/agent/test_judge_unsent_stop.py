"""A stop the judge decides for a node that has no line to it yet (or lost it) is sent when the
node connects: a run whose ``--max-wall`` passed before every node had connected was stopped
only on the connected nodes, and the others trained on. A real judge, real sockets, peers
speaking for the nodes (tests/agent/test_judge.py's ``FakeNode``)."""

from __future__ import annotations

import os

from agent.judge.control import running_judge, start_judge, stop_judge
from tests.agent.test_judge import TOKEN, FakeNode, events
from tests.waits import wait_for_sync


def test_max_wall_reached_before_a_node_connects_stops_it_when_it_connects(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN,
                                  "nodes": ["node0", "node1"], "max_wall": 1})
    try:
        n0 = FakeNode(info["port"], "node0", {})
        wait_for_sync(lambda: "stop" in n0.asked, 60, "node0 asked to stop at --max-wall")
        wait_for_sync(lambda: any(e.get("what") == "policy" for e in events(run_root)), 30,
                      "the judge's policy event")
        n1 = FakeNode(info["port"], "node1", {})  # connects after the limit was reached
        wait_for_sync(lambda: "stop" in n1.asked, 60, "node1 asked to stop when it connected")
        end = n1.args[n1.asked.index("stop")]["end"]
        assert end["state"] == "stopped" and "--max-wall" in end["cause"]["message"]
        assert n0.asked.count("stop") == 1 and n1.asked.count("stop") == 1
        stops = [e for e in events(run_root) if e.get("what") == "policy"]
        assert len(stops) == 1, stops  # decided once, sent to each node once
    finally:
        stop_judge(run_root)
        wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")
