"""A rendezvous that never completes says what it waits for (issue 11, "a run that never
comes back"), with real torchrun on two local nodes.

One node's torchrun is stopped (SIGSTOP: it can neither leave the rendezvous nor join the
next round, as a torchrun hung in the store or on a host that froze), then the other node is
restarted: its new torchrun waits in the rendezvous for a peer that never comes, and nothing
steps. rankdeck must say so: ``status --json`` names the node that has not joined and each
torchrun's phase, and a restart requested while that rendezvous is young is refused (a kill
mid-rendezvous can end the whole run); once the wait is past the threshold, restarting the
missing node is allowed and brings the run back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from agent.runfiles import read_json
from console.errors import AgentError
from console.history import History
from console.liveness import check_waiting
from console.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY, TRAINER, local_inventory, node_dir, wind_down  # noqa
from tests.waits import wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT = 240
WAIT_S = 5  # the test's stall threshold: a rendezvous older than this is "waiting"


def stepping_since(ctl: RunController, since: float) -> bool:
    ranks = ctl.state.ranks
    return len(ranks) == 2 and all((r.last_progress or 0) > since for r in ranks.values())


def status_json(run_id: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "console", "status", run_id, "--json",
                          "--stall-after", str(WAIT_S)], capture_output=True, text=True,
                         cwd=REPO, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def test_a_rendezvous_waiting_for_a_stopped_torchrun_names_it(tmp_path):
    work = tmp_path / "work"
    ctl = RunController(local_inventory(work, n=2), LocalTransport(), History())
    ctl.state.stall_min_s = 600.0  # first: every rendezvous is young (the refusal below)
    frozen = None
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=3, grace=3,
                                    args=TINY + ["--steps", "100000"]), preflight=False)
        nodes = ctl.state.nodes
        await wait_for(lambda: stepping_since(ctl, 0) and all(
            (n.phase or {}).get("name") == "workers running" for n in nodes.values()),
            TIMEOUT, "both ranks stepping, both torchruns running workers")

        frozen = read_json(os.path.join(node_dir(work, ctl.run_id, "node1"), "state.json"),
                           {})["torchrun_pid"]
        os.kill(frozen, signal.SIGSTOP)
        res = await ctl.restart("node0")
        assert not isinstance(res["node0"], BaseException), res

        # node0's new torchrun is starting or in the rendezvous: a second restart is refused
        again = (await ctl.restart("node0"))["node0"]
        assert isinstance(again, AgentError) and again.kind == "refused", again
        assert "rendezvous" in str(again) and "node0" in str(again), str(again)
        assert ctl.state.nodes["node0"].restarts == 1  # nothing was touched
        assert any(e.kind == "refused" for e in ctl.state.events)

        # past the threshold the run says what it waits for: node1, its torchrun's phase
        ctl.state.stall_min_s = WAIT_S
        # node0's new torchrun may take longer than WAIT_S to reach the rendezvous on a loaded
        # machine (until then it too is "starting", not joined): wait for it to join
        await wait_for(lambda: ctl.state.waiting is not None and ctl.state.waiting["joined"] == 1,
                       TIMEOUT, "the run waiting, node0 joined")
        doc = status_json(ctl.run_id)
        wait = doc["waiting_for"]
        assert wait is not None, doc
        assert [m["node"] for m in wait["missing"]] == ["node1"], wait
        assert wait["missing"][0]["phase"].startswith("workers running"), wait
        assert wait["joined"] == 1 and wait["nodes"] == 2, wait
        assert "node1" in wait["text"], wait
        phases = {n["name"]: n["phase"] for n in doc["nodes"]}
        assert phases["node0"]["name"] == "rendezvous", phases
        assert phases["node0"]["text"].startswith("rendezvous (round"), phases
        assert phases["node1"]["name"] == "workers running", phases
        assert any(e.kind == "waiting" and "node1" in e.text for e in ctl.state.events)

        # restarting the node that never joined is the remedy: allowed now, and it works
        since = max(r.last_progress or 0 for r in ctl.state.ranks.values())
        res = await ctl.restart("node1")
        assert not isinstance(res["node1"], BaseException), res
        frozen = None
        await wait_for(lambda: stepping_since(ctl, since), TIMEOUT, "both ranks stepping again")
        assert check_waiting(ctl.state) is None
    finally:
        if frozen is not None:
            try:
                os.kill(frozen, signal.SIGCONT)
            except ProcessLookupError:
                pass
        left = await wind_down(ctl)
    assert left == [], left
