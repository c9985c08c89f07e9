"""Issue 25: a new shell's `rankdeck status RUN --json` has the hosts' rates.

Rates (CPU %, network Gbit/s) are deltas of counters, and a new shell's `status` starts a
fresh agent `serve` on every host: the host sample it prints must have them already, not
only a console that has watched the run for two samples. A real local run (2 nodes, real
torchrun, the reference trainer); `status` and `stop` through the CLI in new processes.
"""

from __future__ import annotations

import json

import pytest

from agent.host.stats import HostSampler
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from tests.cli import rankdeck
from tests.waits import wait_for

from .helpers import TINY, TRAINER, local_inventory, wind_down

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 300


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


async def test_status_from_a_new_shell_has_cpu_network_and_disk_rates(tmp_path):
    work = tmp_path / "work"
    # 2 nodes: the rates are each node's host's (each node more is its start-up's time)
    ctl = RunController(local_inventory(work, n=2), LocalTransport(), History())
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0, grace=5,
                                    args=TINY + ["--steps", "100000"]), preflight=False)
        ranks = ctl.state.ranks
        await wait_for(lambda: len(ranks) == 2 and all((r.step or 0) >= 1
                                                       for r in ranks.values()),
                       RUN_TIMEOUT, "both ranks stepping")
        await ctl.close()  # the run goes on; from here on only new shells look at it
        # the workdir's disk has MB/s where it is a block device (not tmpfs or overlay)
        rate_keys = ["cpu_pct", "net_rx_gbps", "net_tx_gbps"]
        if HostSampler().sample(str(work))["disk"] is not None:
            rate_keys += ["disk_read_mbs", "disk_write_mbs"]

        out = rankdeck("status", ctl.run_id, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["state"] == "running", doc["state"]
        assert len(doc["nodes"]) == 2
        for node in doc["nodes"]:
            host = node["host"]
            assert host is not None, node["name"]
            rates = {k: host[k] for k in rate_keys}
            assert all(is_number(v) for v in rates.values()), (node["name"], rates)
            assert 0.0 <= host["cpu_pct"] <= 100.0, (node["name"], host["cpu_pct"])

        stopped = rankdeck("stop", ctl.run_id)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        left = await wind_down(ctl)
    assert not left, "processes left behind: %s" % left
