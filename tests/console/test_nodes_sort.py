"""Ordering the nodes table by a node's telemetry: the key functions, then the real app.

The orders (console/tui/nodeorder.py): gpu util and tok/s and network the lowest first, cpu the
highest first; a node without the value, or with a value that is no finite number, last.
"""

from __future__ import annotations

import time

import pytest

from console.model.nodes import NodeState, RankState
from console.model.telemetry import node_telemetry
from console.tui.app import RankdeckApp
from console.tui.nodeorder import ORDERS, TELEMETRY, ordered, telemetry_key
from tests.waits import wait_until
from tests.console.scripted import (controller, gpu_snapshot, host_names, no_gpu_snapshot,
                                   standard_script)

pytestmark = pytest.mark.usefixtures("own_home")

SIZE = (160, 48)


def node(name: str, util=None, host=None) -> NodeState:
    snap = None if util is None else {"gpus": [{"index": i, "util": u}
                                               for i, u in enumerate(util)]}
    return NodeState(name=name, state="running", gpu=snap, host=host)


def names(nodes, by_node=None, order="gpu util") -> list[str]:
    return [ns.name for ns, _ranks in ordered(nodes, by_node or {}, order)]


# -- the keys --------------------------------------------------------------------------------
def test_gpu_util_puts_the_lowest_mean_first_and_breaks_ties_by_the_lowest_gpu():
    nodes = [node("a", [90, 90]), node("b", [95, 5]), node("c", [60, 40]), node("d", [50, 50])]
    # means 90, 50, 50, 50: b, c, d tie on the mean, then their lowest GPU (5, 40, 50)
    assert names(nodes) == ["b", "c", "d", "a"]


def test_network_is_in_plus_out_over_ethernet_and_infiniband_the_least_first():
    ib = [{"port": "mlx5_0/1", "rx_gbps": 150.0, "tx_gbps": 150.0}]
    nodes = [node("eth-only", host={"net_rx_gbps": 40.0, "net_tx_gbps": 40.0}),
             node("with-ib", host={"net_rx_gbps": 0.1, "net_tx_gbps": 0.1, "ib": ib}),
             node("slow", host={"net_rx_gbps": 2.0, "net_tx_gbps": 1.0}),
             node("rx-only", host={"net_rx_gbps": 5.0})]
    assert names(nodes, order="network") == ["slow", "rx-only", "eth-only", "with-ib"]


def test_cpu_puts_the_busiest_host_first():
    nodes = [node("a", host={"cpu_pct": 20.0}), node("b", host={"cpu_pct": 97.5}),
             node("c", host={"cpu_pct": 0})]
    assert names(nodes, order="cpu") == ["b", "a", "c"]


def test_tok_s_is_the_nodes_ranks_summed_the_lowest_first():
    nodes = [node("a"), node("b"), node("c")]
    by_node = {"a": [RankState(0, "a", tok_s=900.0), RankState(1, "a", tok_s=900.0)],
               "b": [RankState(2, "b", tok_s=1000.0), RankState(3, "b", tok_s=100.0)],
               "c": [RankState(4, "c"), RankState(5, "c")]}  # prints no token counts
    assert names(nodes, by_node, "tok/s") == ["b", "a", "c"]


@pytest.mark.parametrize("hostile", ["99", float("nan"), True, None, [1], {"x": 1},
                                     float("inf"), -float("inf"), 10 ** 400, 1e300],
                         ids=["text", "nan", "bool", "none", "list", "object", "inf", "-inf",
                              "400 digits", "1e300"])
def test_a_hostile_or_missing_value_is_n_a_and_sorts_last(hostile):
    """telemetry.py turns what is not a number (or one no host measures) into None; the order
    puts it after the others whichever the direction, and never raises."""
    assert node_telemetry(None, {"cpu_pct": hostile})["cpu_pct"] is None
    assert node_telemetry({"gpus": [{"util": hostile}]}, None)["gpu_util_mean"] is None
    odd_cpu = node("odd", [hostile], {"cpu_pct": hostile, "net_rx_gbps": hostile,
                                      "net_tx_gbps": hostile})
    for order in TELEMETRY:
        nodes = [odd_cpu, node("x", [10], {"cpu_pct": 5.0, "net_rx_gbps": 1.0}),
                 node("y", [20], {"cpu_pct": 1.0, "net_rx_gbps": 2.0})]
        by_node = {"x": [RankState(0, "x", tok_s=1.0)], "y": [RankState(1, "y", tok_s=2.0)],
                   "odd": [RankState(2, "odd", tok_s=hostile)]}
        assert names(nodes, by_node, order)[-1] == "odd", order


def test_infinities_are_n_a_not_first_even_in_a_row_not_from_telemetry_py():
    """inf and -inf in one sum would be NaN, which sorts nowhere in particular; two huge
    figures overflow."""
    assert telemetry_key({"cpu_pct": float("inf")}, "cpu") == (1,)
    row = {"net_rx_gbps": float("inf"), "net_tx_gbps": float("-inf")}
    assert telemetry_key(row, "network") == (1,)
    assert telemetry_key({"net_rx_gbps": 1e308, "net_tx_gbps": 1e308}, "network") == (1,)
    nodes = [node("inf", [float("inf")]), node("ok", [50])]
    assert names(nodes) == ["ok", "inf"]


def test_no_telemetry_at_all_keeps_inventory_order():
    nodes = [node("c"), node("a"), node("b")]
    for order in TELEMETRY:
        assert names(nodes, order=order) == ["c", "a", "b"]


def test_ranks_keep_rank_order_under_a_node_for_a_telemetry_order():
    ranks = [RankState(0, "a", step=9, step_time=0.1), RankState(1, "a", step=3, step_time=2.0),
             RankState(2, "a", step=5, step_time=0.5)]
    [(_ns, got)] = ordered([node("a", [50])], {"a": ranks}, "gpu util")
    assert [rs.rank for rs in got] == [0, 1, 2]
    [(_ns, got)] = ordered([node("a", [50])], {"a": ranks}, "step")
    assert [rs.rank for rs in got] == [1, 2, 0]  # the old orders still sort ranks


# -- the real app ----------------------------------------------------------------------------
def node_rows(app) -> list[str]:
    return [key for key in app.nodes._keys if key.startswith("n:")]


def header(app) -> str:
    return app.nodes.header[0][0]


async def test_o_orders_the_table_by_gpu_util_then_cpu_and_O_goes_back(tmp_path):
    """node3's GPUs idle, node4 has none: the gpu util order puts node3 first and node4 last;
    the cpu order puts the busiest host first and the one that sent text last."""
    hosts = host_names(4)
    script = standard_script(hosts, t0=time.time())
    gpus = {"node1": gpu_snapshot(2, util=90), "node2": gpu_snapshot(2, util=80),
            "node3": gpu_snapshot(2, util=12), "node4": no_gpu_snapshot()}
    t = script.transport(gpus=gpus)
    ctl, launch = controller(str(tmp_path), t)
    app = RankdeckApp(ctl, launch)
    samples = {"node1": {"cpu_pct": 30.0}, "node2": {"cpu_pct": "99"},
               "node3": {"cpu_pct": 12.0}, "node4": {"cpu_pct": 95.0}}
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.launching, what="launch")
        await wait_until(pilot, lambda: all(t.node(h).subscribed for h in hosts), what="subscribed")
        for h in hosts:
            t.node(h).stream.send({"t": "gpu", "snap": gpus[h], "host": samples[h]})
        await wait_until(pilot, lambda: all(ctl.state.nodes[h].host == samples[h] for h in hosts),
                         what="host samples")
        await wait_until(pilot, lambda: "cpu 95%" in "".join(app.nodes.row_text("n:node4")),
                         what="node4's telemetry on screen")
        app.nodes.focus()
        assert node_rows(app) == ["n:node1", "n:node2", "n:node3", "n:node4"]
        for _ in range(len(ORDERS)):
            if app.nodes.order == "gpu util":
                break
            await pilot.press("o")
        assert app.nodes.order == "gpu util"
        assert "gpu util, lowest first▼" in header(app)
        assert node_rows(app) == ["n:node3", "n:node2", "n:node1", "n:node4"]
        app.nodes.set_open("node3", True)
        await pilot.pause()
        assert app.nodes._keys[:3] == ["n:node3", "r:4", "r:5"]
        on_screen = app.nodes.row_text("n:node3")[0]
        assert on_screen.lstrip("▾▸ ").startswith("node3")
        assert "gpu 9/10%" in on_screen  # its GPUs at 12 and 9
        while app.nodes.order != "cpu":
            await pilot.press("o")
        assert "cpu %, highest first▼" in header(app)
        assert node_rows(app) == ["n:node4", "n:node1", "n:node3", "n:node2"]
        await pilot.press("O")
        assert app.nodes.order == ORDERS[ORDERS.index("cpu") - 1]
        await pilot.press("o", "o")
        assert app.nodes.order == ORDERS[0] and "▼" not in header(app)
        assert node_rows(app) == ["n:node1", "n:node2", "n:node3", "n:node4"]
