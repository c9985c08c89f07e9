"""docs/PROMETHEUS.md's examples: the alert rules Prometheus's own ``promtool check rules``
accepts, and a Grafana dashboard of valid JSON whose panels ask for metrics the judge serves
(agent/judge/figures.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from agent.judge import figures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(REPO, "docs", "prometheus-rules.yml")
DASHBOARD = os.path.join(REPO, "docs", "grafana-dashboard.json")
SERVED = {spec[0] for spec in vars(figures).values()
          if isinstance(spec, tuple) and len(spec) == 3 and str(spec[0]).startswith("rankdeck_")}


def metrics_named(text: str) -> set[str]:
    return set(re.findall(r"\brankdeck_[a-z_]+", text))


def test_the_dashboard_is_json_with_a_panel_for_each_figure_the_issue_names():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dash["panels"]}
    asked = metrics_named(" ".join(exprs.values()))
    assert asked <= SERVED, asked - SERVED
    for metric in ("rankdeck_rank_step", "rankdeck_rank_loss", "rankdeck_rank_tokens_per_second",
                   "rankdeck_rank_stalled", "rankdeck_node_gpu_utilization",
                   "rankdeck_node_gpu_memory_used_bytes"):
        assert metric in asked, metric
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "run"]


def test_the_alert_rules_name_served_metrics_and_promtool_accepts_them():
    with open(RULES) as f:
        text = f.read()
    assert "rankdeck_rank_stalled == 1" in text
    assert metrics_named(text) <= SERVED
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian's prometheus package; scripts/setup.sh --test)")
    out = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 2 rules found" in out.stdout
