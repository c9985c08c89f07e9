"""Issue 42: the deep preflight's result per node (``launch --preflight deep``) is kept in
the run's record, in ``status`` (``nodes[].health``, text and ``--json``) and in the nodes
table's health column; a run without a deep check shows no column.

Scripted agents (tests/console/scripted.py) answer the probe with figures in which node3's
every pair runs at 0.05 Gbit/s: the real console judges them (console/run/deep.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from agent.rules import health as rule
from console.model.state import RunState
from console.model.summary import status_table
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.tui.app import RankdeckApp
from console.tui.nodes import NodesTable
from tests.console.scripted import RUN_ID, ScriptedTransport, standard_script
from tests.local_nodes import local_inventory
from tests.waits import wait_until

SLOW = "node3"


class ProbedTransport(ScriptedTransport):
    """Scripted agents that also answer the deep check's network probe (``netcheck``): each
    probe answers once every node's has asked, rank 0 with every planned pair's figure."""

    def __init__(self, *args, slow=SLOW, moved=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.probes: list = []
        self.slow = slow
        self.moved = set(moved)  # nodes whose code changed after the sync placed it
        self.checked: dict = {}

    def _answer(self, stream, req_id, req) -> None:
        if req.op == "sync_check":  # the sync finds the tree placed; a node in `moved` then
            # holds another one when the deep check asks again
            seen = self.checked[req.node] = self.checked.get(req.node, 0) + 1
            moved = req.node in self.moved and seen > 1
            data = {"same": not moved, "workdir": "/w/" + req.node,
                    "tree": "cd" * 32 if moved else req.args["tree"]}
            return stream.send({"t": "res", "id": req_id, "ok": True, "data": data})
        if req.op != "netcheck":
            return super()._answer(stream, req_id, req)
        self.probes.append((stream, req_id, req))
        world = req.args["world"]
        if len(self.probes) < world:
            return
        names = {r.args["rank"]: r.node for _s, _i, r in self.probes}

        def rate(a, b):
            return 0.05 if self.slow in (names[a], names[b]) else 9.8
        pairs = [[a, b, rate(a, b)] for r in rule.rounds(world) for a, b in r]
        again = [[a, b, rate(a, b)] for r in rule.recheck_rounds(
            world, [tuple(p) for p in pairs]) for a, b in r]
        for s, i, r in self.probes:
            data = {"backend": "gloo", "rounds_s": 1.0, "gpus": []}
            if r.args["rank"] == 0:
                data.update(pairs=pairs, again=again)
            s.send({"t": "res", "id": i, "ok": True, "data": data})
        self.probes = []


def deep_run(tmp_path, spare: bool = True, **probed):
    """node1..node4, node4 a spare; node3's network slow. (controller, transport)"""
    active = ["node1", "node2", "node4"]
    facts = {n: {"disk_write_mbps": 800.0, "disk_dir": "/w"} for n in
             ("node1", "node2", "node3", "node4")}
    t = standard_script(active, t0=time.time()).transport(facts=facts)
    probed = ProbedTransport(nodes=t.nodes, facts=facts, **probed)
    inv = local_inventory(str(tmp_path), 4, first=1, python=sys.executable, path="",
                          slots=2, spares=(3,) if spare else ())
    ctl = RunController(inv, probed, History(str(tmp_path / "history")), run_id=RUN_ID)
    return ctl, probed


async def test_the_deep_preflight_is_kept_in_the_record_and_status(tmp_path):
    ctl, t = deep_run(tmp_path)
    async with ctl:
        await ctl.launch(LaunchSpec(script="train.py", nproc_per_node=2), preflight="deep")
        assert sorted(t.ops("start")) == ["node1", "node2", "node4"]
        status = ctl.status()
    assert t.ops("sync_check") == []  # no --sync: nothing is said about code
    nodes = {n["name"]: n for n in status["nodes"]}
    for name in ("node1", "node2", "node4"):
        assert nodes[name]["health"] == {"ok": True, "kind": "ok", "problems": [],
                                         "net_gbps": 9.8, "disk_write_mbps": 800.0}
    sick = nodes[SLOW]["health"]
    assert sick["ok"] is False and sick["kind"] == "network" and sick["net_gbps"] == 0.05
    assert sick["problems"] == ["network: 0.05 Gbit/s at best, the median node 9.8 Gbit/s "
                                "(a node under 1/3 of the median is named)"]
    json.dumps(status)  # --json prints it
    # the text: a health column, the short form of each node's result
    table = status_table(status)
    head = [line for line in table.split("\n") if line.startswith("node ")][0]
    assert head.split() == ["node", "state", "restarts", "exit", "health", "rank",
                            "rank", "state", "step", "loss"]
    rows = {line.split()[0]: line for line in table.split("\n")
            if line.startswith("node") and not line.startswith("node ")}
    assert "ok 9.8G" in rows["node1"] and "slow 0.05G" in rows[SLOW]
    # kept in the run's record: a status from another shell shows it again
    record = History(str(tmp_path / "history")).load(RUN_ID)
    assert record["health"][SLOW]["kind"] == "network"
    again = RunController.from_record(record, ScriptedTransport(),
                                      History(str(tmp_path / "history")))
    assert again.status()["nodes"][0]["health"]["net_gbps"] == 9.8
    assert "ok 9.8G" in status_table(again.status())


async def test_a_node_whose_code_differs_from_the_sync_is_named_and_replaced(tmp_path):
    """``launch --sync DIR --preflight deep``: the tree the sync placed is asked of every
    node again; node2's differs: named, and the spare runs in its place."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('step')\n")
    ctl, t = deep_run(tmp_path, slow=None, moved={"node2"})
    async with ctl:
        await ctl.launch(LaunchSpec(script="train.py", nproc_per_node=2, sync=str(code)),
                         preflight="deep")
        assert sorted(t.ops("start")) == ["node1", "node3", "node4"]
        status = ctl.status()
    tree = ctl.record["sync"]["tree"]
    assert sorted(t.ops("sync_check")) == sorted(["node1", "node2", "node3", "node4"] * 2)
    sick = {n["name"]: n for n in status["nodes"]}["node2"]["health"]
    assert sick["kind"] == "code" and sick["problems"] == [
        "code: /w/node2 holds tree %s, not the synced tree %s" % ("cd" * 6, tree[:12])]
    assert "code" in [line.split()[6] for line in status_table(status).split("\n")
                      if line.startswith("node2 ")]


async def test_a_plain_launch_keeps_no_health(tmp_path):
    ctl, t = deep_run(tmp_path, spare=False)
    async with ctl:
        await ctl.launch(LaunchSpec(script="train.py", nproc_per_node=2))
        status = ctl.status()
    assert t.ops("netcheck") == []
    assert all(n["health"] is None for n in status["nodes"])
    assert "health" not in status_table(status)
    assert "health" not in History(str(tmp_path / "history")).load(RUN_ID) or \
        not History(str(tmp_path / "history")).load(RUN_ID)["health"]


def test_a_hostile_record_entry_is_checked_before_it_is_shown(tmp_path):
    ctl, _t = deep_run(tmp_path)
    ctl.state.set_health("node1", {"ok": False, "kind": "\x1b[31mx", "net_gbps": float("nan"),
                                   "problems": ["disk: \x1b]8;;evil\x07full\nforged row"] * 50})
    entry = ctl.state.nodes["node1"].health
    assert entry["kind"] == "host" and entry["net_gbps"] is None
    assert len(entry["problems"]) == 16
    assert all("\x1b" not in p and "\n" not in p for p in entry["problems"])
    ctl.state.set_health("node2", "not an entry")
    assert ctl.state.nodes["node2"].health is None


def health_state() -> RunState:
    state = RunState("r", [("node%d" % i, "10.0.0.%d" % i) for i in range(1, 5)])
    state.set_health("node1", {"ok": True, "problems": [], "net_gbps": 9.8,
                               "disk_write_mbps": 800.0})
    state.set_health("node2", {"ok": False, "kind": "network", "net_gbps": 0.05,
                               "problems": ["network: 0.05 Gbit/s at best"]})
    state.set_health("node3", {"ok": False, "kind": "disk", "net_gbps": 9.7,
                               "problems": ["disk: No space left on device"]})
    return state  # node4: no deep check


def test_the_nodes_table_has_a_health_column_only_once_a_deep_check_ran():
    table = NodesTable(health_state())
    table.refresh_rows()
    assert "health" in table.header[0][0]
    text = {n: "".join(t for t, _s in table.row_lines("n:" + n)[0])
            for n in ("node1", "node2", "node3", "node4")}
    column = table.header[0][0].index("health")
    assert text["node1"][column:].startswith("ok 9.8G ")
    assert text["node2"][column:].startswith("slow 0.05G ")
    assert text["node3"][column:].startswith("disk ")
    assert text["node4"][column:].startswith("- ")
    styles = {t.strip(): s for t, s in table.row_lines("n:node2")[0]}
    assert styles["slow 0.05G"] == "bold red"
    plain = NodesTable(RunState("r", [("node1", "10.0.0.1")]))
    plain.refresh_rows()
    assert "health" not in plain.header[0][0]


def health_of(app, node: str) -> str:
    """What the view's health column says of ``node``."""
    header = app.nodes.header[0][0]
    if "health" not in header and "hlth" not in header:
        return ""  # the table not refreshed since the check yet
    column = header.index("health") if "health" in header else header.index("hlth")
    return "".join(app.nodes.row_text("n:" + node)[:1])[column:].split("  ")[0].strip()


async def test_the_view_shows_the_health_column_within_its_width(tmp_path):
    """At 120x35 the nodes table is a narrow side column: the health column keeps its word
    (``slow``), every node row fits; wider, the figure comes with it (``slow 0.05G``)."""
    ctl, _t = deep_run(tmp_path)

    async def launch():
        await ctl.launch(LaunchSpec(script="train.py", nproc_per_node=2), preflight="deep")
    app = RankdeckApp(ctl, launch)
    async with app.run_test(size=(120, 35)) as pilot:
        await wait_until(pilot, lambda: not app.launching, what="launch")
        await wait_until(pilot, lambda: app.nodes.row_text("n:node3") and
                         health_of(app, "node3") == "slow", what="node3's health")
        assert health_of(app, "node1") == "ok"
        width = app.nodes.scrollable_content_region.width
        for key in ("n:node1", "n:node2", "n:node4", "n:node3"):
            assert len(app.nodes.row_text(key)[0].rstrip()) <= width, key
        await pilot.resize_terminal(240, 50)
        await wait_until(pilot, lambda: health_of(app, "node3") == "slow 0.05G",
                         what="the figure, with room for it")
        assert health_of(app, "node1") == "ok 9.8G"
    await ctl.close()
