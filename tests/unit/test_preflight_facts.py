"""A host's preflight answer is untrusted (console/run/facts.py): every field is of its kind
before the check compares, counts or prints it, and a malformed one is named, not a crash."""

from __future__ import annotations

import copy
import random

from console.run import facts
from console.run.deep import gpu_problems, judge_hosts
from console.run.preflight import HostCheck, _judge, check_table
from inventory.model import Host

GOOD = {"hostname": "node0", "hostname_resolves": "10.0.0.1", "time": 1.0, "time_after": 2.0,
        "workdir": "/w", "workdir_exists": True, "workdir_writable": True,
        "python_path": "/usr/bin/python3", "python_exists": True, "disk_free": 5 << 30,
        "disk_write_mbps": 900.0, "disk_dir": "/w", "python": "3.11.7", "torch": "2.13.0",
        "cuda": None, "nccl": None, "gpu_source": "none", "gpu_reason": "no NVML",
        "gpus": [{"index": 0, "name": "H200", "mem_free": 1 << 30}],
        "gpu_health": [{"index": 0, "ecc_uncorrected": 2, "throttle": ["hw_slowdown"],
                        "xid": [[1.0, 79]], "pids": [12], "pcie_width": 8,
                        "pcie_width_max": 16}]}
HOSTILE = [None, True, -1, 2 ** 70, 1.5, float("nan"), "x", "[b]red[/b]", [], {}, [1],
           [{}], [[1, 2]], {"index": "0"}, [{"index": 0, "xid": 5}], ["2.13.0"]]


def test_an_answer_of_the_right_kinds_is_kept_whole():
    got, bad = facts.checked(copy.deepcopy(GOOD))
    assert bad == [] and got == GOOD


def test_a_field_of_another_kind_is_left_out_and_named():
    raw = dict(GOOD, torch=["2.13.0"], disk_free="lots",
               gpu_health=[{"index": 0, "xid": 5, "pids": ["init"]}, "gpu"])
    got, bad = facts.checked(raw)
    assert "torch" not in got and "disk_free" not in got
    assert got["gpu_health"] == [{"index": 0}]
    assert {"torch", "disk_free", "gpu_health.xid", "gpu_health.pids"} <= set(bad)
    assert any(b.startswith("gpu_health (") for b in bad)


def test_any_answer_is_judged_and_shown_without_an_exception():
    """The check's own rules over whatever a host sends, once checked: no TypeError from
    comparing, counting or formatting a field of the wrong kind."""
    rnd = random.Random(3)
    keys = list(GOOD) + ["script", "script_exists", "script_module", "torch_error"]
    for _ in range(2000):
        raw = copy.deepcopy(GOOD)
        for key in rnd.sample(keys, rnd.randint(1, 6)):
            raw[key] = copy.deepcopy(rnd.choice(HOSTILE))
        checks = []
        for name in ("node0", "node1"):
            c = HostCheck(name)
            c.facts, _bad = facts.checked(raw if name == "node0" else copy.deepcopy(GOOD))
            checks.append(c)
        _judge({c.name: c for c in checks}, {c.name: Host(name=c.name, addr="10.0.0.1")
                                             for c in checks}, launching=True)
        judge_hosts(checks)
        for g in checks[0].facts.get("gpu_health", []):
            gpu_problems(g)
        assert isinstance(check_table(checks), str)
