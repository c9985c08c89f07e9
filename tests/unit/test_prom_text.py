"""Prometheus's text format as agent/rules/prom_text.py writes it, read back with
``prometheus-client``'s own parser; the judge's families (agent/judge/figures.py) from a view;
and `--prometheus` / the inventory's ``prometheus:`` as a launch takes them."""

from __future__ import annotations

import argparse
import math

import pytest

from agent.judge.figures import RunFigures, families
from agent.rules.judge_view import RunView
from agent.rules.mask import Masker
from agent.rules.prom_text import Family, encode, escape_label, render
from console.errors import UsageError
from console.launch.options import judge_settings
from console.run.judge import prometheus_spec
from inventory.addresses import listen_address
from inventory.loader import load_inventory
from inventory.model import Host, Inventory, InventoryError

parser = pytest.importorskip("prometheus_client.parser",
                             reason="needs prometheus-client (the test extras)")

NASTY = 'a\\b "quoted"\nnext line, {braces}=, ünïcode'


def parsed(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def test_label_values_with_backslash_quote_and_newline_read_back_as_written():
    fam = Family("rankdeck_rank_step", "gauge", 'HELP with a \\ and a\nnewline and "quotes"')
    fam.add({"run": NASTY, "rank": "0"}, 7)
    fam.add({"run": "plain", "rank": "1"}, 8.5)
    text = render([fam])
    assert '\\\\b \\"quoted\\"\\nnext' in text  # escaped as the format says
    got = parsed(text)["rankdeck_rank_step"]
    assert got.type == "gauge"
    assert got.documentation == 'HELP with a \\ and a\nnewline and "quotes"'
    assert [(s.labels, s.value) for s in got.samples] == [
        ({"run": NASTY, "rank": "0"}, 7.0), ({"run": "plain", "rank": "1"}, 8.5)]
    assert escape_label('"\\\n') == '\\"\\\\\\n'


def test_counters_end_in_total_and_special_values_read_back():
    counter = Family("rankdeck_node_restarts_total", "counter", "Restarts.")
    counter.add({"node": "n0"}, 3)
    gauge = Family("rankdeck_rank_loss", "gauge", "Loss.")
    for i, value in enumerate((float("nan"), float("inf"), float("-inf"), 1e-12, 2 ** 53)):
        gauge.add({"rank": str(i)}, value)
    gauge.add({"rank": "none"}, None)  # no value: no sample
    gauge.add({"rank": "bool"}, True)
    text = render([counter, gauge, Family("rankdeck_empty", "gauge", "Nothing.")])
    assert "# TYPE rankdeck_node_restarts_total counter\n" in text
    assert "rankdeck_empty" not in text  # a family with no sample is left out
    got = parsed(text)
    assert got["rankdeck_node_restarts"].type == "counter"  # the client's name, less _total
    assert [s.name for s in got["rankdeck_node_restarts"].samples] == [
        "rankdeck_node_restarts_total"]
    values = [s.value for s in got["rankdeck_rank_loss"].samples]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 1e-12, 2.0 ** 53]
    with pytest.raises(ValueError):
        Family("rankdeck_restarts", "counter", "a counter without _total")
    with pytest.raises(ValueError):
        Family("rankdeck rank", "gauge", "a space")
    with pytest.raises(ValueError):
        Family("rankdeck_x", "gauge", "").add({"bad-label": "x"}, 1)
    assert encode("\udcff") == b"?"  # a lone surrogate from a host's bytes


def test_the_judges_families_parse_with_every_label_masked():
    view = RunView(["node0", "node1"], 60)
    figures = RunFigures()
    recs = [{"k": "file", "f": 1, "rank": 0},
            {"k": "metric", "f": 1, "step": 4, "loss": 1.25, "tok_s": 900.0},
            {"k": "telemetry", "gpu": {"gpus": [{"index": 0, "util": 40, "mem_used": 5,
                                                 "mem_total": 10}]}},
            {"k": "ckpt_done", "f": 1, "step": 4, "complete": True}]
    for meta in recs:
        view.apply("node0", meta, 0.0)
        figures.apply("node0", meta, view)
    figures.apply_state("node0", {"restarts": 1})
    masker = Masker(["s3cret-value"])
    text = render(families("run-s3cret-value", view, figures,
                           {"node0": "s3cret-value.host", "node1": "10.0.0.2"},
                           masker.mask_text))
    assert "s3cret-value" not in text
    got = parsed(text)
    step = got["rankdeck_rank_step"].samples[0]
    assert step.labels == {"run": "run-****", "node": "node0", "host": "****.host", "rank": "0"}
    assert step.value == 4
    assert got["rankdeck_node_gpu_utilization"].samples[0].value == 0.4
    assert [s.value for s in got["rankdeck_node_restarts"].samples] == [1, 0]
    assert got["rankdeck_checkpoint_last_step"].samples[0].labels == {"run": "run-****"}
    # a cordoned node leaves the view: its series, and what was kept for them, go
    view.cordon("node0")
    text = render(families("r", view, figures, {}, masker.mask_text))
    assert 'node="node0"' not in text and figures.gpus == {} and figures.rank == {}


@pytest.mark.parametrize("given, want", [
    ("9400", (None, 9400)), ("0.0.0.0:9400", ("0.0.0.0", 9400)),
    ("metrics.example:80", ("metrics.example", 80)), ("[::1]:9400", ("::1", 9400))])
def test_prometheus_addresses_read(given, want):
    assert listen_address(given) == want


@pytest.mark.parametrize("given", ["", "0", "65536", "x", "::1:9400", "[nope]:9400",
                                   "a b:9400", ":9400", "9400:", "host:port"])
def test_prometheus_addresses_refused(given):
    with pytest.raises(ValueError):
        listen_address(given)


def test_launch_prometheus_overrides_the_inventorys_and_defaults_to_the_rendezvous_host(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("transport: local\nprometheus: 9400\n"
                    "hosts:\n  - {name: node0, addr: 127.0.0.2}\n"
                    "  - {name: node1, addr: 127.0.0.3}\n")
    inv = load_inventory(str(path), {})
    assert inv.prometheus == "9400"
    args = argparse.Namespace(stall_after=None, prometheus=None)
    assert judge_settings(args, inv)["prometheus"] == "9400"
    args.prometheus = "0.0.0.0:9500"
    assert judge_settings(args, inv)["prometheus"] == "0.0.0.0:9500"
    args.prometheus = "99999"
    with pytest.raises(UsageError, match="--prometheus '99999': the port must be"):
        judge_settings(args, inv)
    rdzv = inv.hosts[0]
    assert prometheus_spec("9400", rdzv, inv.hosts) == {
        "addr": "127.0.0.2", "port": 9400,
        "hosts": {"node0": "127.0.0.2", "node1": "127.0.0.3"}}
    assert prometheus_spec("[::1]:9", rdzv, [])["addr"] == "::1"
    assert prometheus_spec(None, rdzv, inv.hosts) is None
    assert judge_settings(argparse.Namespace(stall_after=None),
                          Inventory(path="x", hosts=[Host(name="a", addr="a")]))[
        "prometheus"] is None


def test_an_inventorys_bad_prometheus_is_named_with_its_line(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("transport: local\nhosts:\n  - {name: node0, addr: 127.0.0.2}\n"
                    "prometheus: [9400]\n")
    with pytest.raises(InventoryError, match=r"hosts.yaml:4: prometheus must be a port"):
        load_inventory(str(path), {})
    path.write_text("transport: local\nprometheus: 'host:0'\n"
                    "hosts:\n  - {name: node0, addr: 127.0.0.2}\n")
    with pytest.raises(InventoryError, match=r"hosts.yaml:2: prometheus: 'host:0': the port"):
        load_inventory(str(path), {})
