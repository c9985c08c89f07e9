"""A rank that raises at start after joining its process group, on 2 local nodes with real
torchrun (issue 29): its node's cause names the rank and its exception, secret masked.

Once the script has called ``init_process_group``, torch prefixes everything the rank's
uncaught exception prints with ``[rank1]: `` (torch/distributed/distributed_c10d.py
``_distributed_excepthook``), so the last line of its stderr reads
``[rank1]: RuntimeError: credential rejected: <secret>``. The rank fails in each of its two
attempts (one restart) within a second of its start; the secret in its message has another
secret of the inventory as its prefix. The other ranks wait until the test has seen rank 1's
node fail for good, then end (a fixed sleep there held the run two minutes past the failure). The cause must read the same in the controller's state, in
``status --json`` and in the plain status table (what ``--no-tui`` prints at its end).
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from inventory.model import EnvValue
from tests.cli import rankdeck
from tests.waits import wait_for

from .helpers import local_inventory, rank_log_files, wind_down

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 300
TOKEN = "tok-5ecret-93b1-77aa"
PREFIX = "tok-5ecret"  # another secret of the inventory, a prefix of TOKEN
EXPECTED = "rank 1: RuntimeError: credential rejected: ****"
SCRIPT = """\
    import os, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if os.environ["RANK"] == "1":
        raise RuntimeError("credential rejected: " + os.environ["API_TOKEN"])
    print("rank", os.environ["RANK"], "waiting", flush=True)
    end = time.monotonic() + 300
    while not os.path.exists(%r) and time.monotonic() < end:  # the test's release
        time.sleep(0.2)
"""


@pytest.fixture
async def controller(tmp_path):
    inv = local_inventory(tmp_path / "work", n=2)  # (each node more: its start-up's time)
    for host in inv.hosts:
        host.env = {"API_TOKEN": EnvValue(TOKEN, secret=True),
                    "API_USER": EnvValue(PREFIX, secret=True)}
    ctl = RunController(inv, LocalTransport(), History())
    yield ctl
    left = await wind_down(ctl)
    assert not left, "processes left behind: %s" % left


async def test_rank_raising_after_init_is_named_with_its_masked_exception(controller, tmp_path):
    ctl = controller
    script = tmp_path / "crash.py"
    release = tmp_path / "release"
    script.write_text(textwrap.dedent(SCRIPT % str(release)))
    await ctl.launch(LaunchSpec(script=str(script), max_restarts=1, grace=3), preflight=False)
    # rank 1's node out of restarts: the others may end (they would wait in a collective)
    await wait_for(lambda: 1 in ctl.state.ranks and
                   ctl.state.nodes[ctl.state.ranks[1].node].state == "failed", RUN_TIMEOUT,
                   lambda: "rank 1's node failed: %s" % ctl.state.status()["nodes"])
    release.write_text("")
    final = await asyncio.wait_for(ctl.wait_done(), RUN_TIMEOUT)
    await ctl.stop_store()
    assert final == "failed", ctl.state.status()

    node = ctl.state.ranks[1].node
    # the case of the issue: every attempt's stderr ends in torch's prefixed exception line
    stderrs = [p for p in rank_log_files(tmp_path / "work", ctl.run_id, node)
               if p.endswith("stderr.log")]
    assert stderrs
    for path in stderrs:
        with open(path) as f:
            said = f.read().strip().splitlines()
        assert said[-1] == "[rank1]: RuntimeError: credential rejected: " + TOKEN, said[-3:]

    assert ctl.state.nodes[node].cause == EXPECTED, ctl.state.nodes[node].cause

    out = rankdeck("status", ctl.run_id, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [n["cause"] for n in doc["nodes"] if n["name"] == node] == [EXPECTED], doc["nodes"]
    out = rankdeck("status", ctl.run_id)  # the table `--no-tui` prints when the run ends
    assert "  %s: %s" % (node, EXPECTED) in out.stdout.splitlines(), out.stdout
    for text in (out.stdout, json.dumps(doc), json.dumps(ctl.state.status())):
        assert PREFIX not in text
