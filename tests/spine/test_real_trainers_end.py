"""Runs that finished must end (issue 15), on 2 local nodes with the reference trainer.

Rank 0 finishes its last step and then aborts (``--abort-at-exit 0``: SIGABRT, as an
interpreter teardown did to a Trainer script that never called ``destroy_process_group``).
Its torchrun, with restarts left, restarts the worker into a rendezvous the other node (whose
workers finished; its torchrun waits in its exit barrier) will never join. Before issue 15
the run stayed `running` until stopped by hand; now rankdeck stops both nodes, the run
fails, and the cause names the rank and the signal, in the node's own journal too.
The same run checks that checkpoints the trainer pruned (``--keep-ckpts 1``) are marked
deleted in ``status --json``.
"""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

from .helpers import TINY, TRAINER, local_inventory, node_dir, wind_down

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 180  # the fixed run: ~30 s of torch start-up and steps, then ~10 s of stopping


@pytest.fixture
async def controller(tmp_path):
    ctl = RunController(local_inventory(tmp_path / "work", n=2), LocalTransport(), History())
    yield ctl
    left = await wind_down(ctl)
    assert not left, "processes left behind: %s" % left


async def test_rank_aborting_after_its_last_step_ends_the_run(controller, tmp_path):
    ctl = controller
    args = TINY + ["--steps", "30", "--ckpt-every", "10", "--keep-ckpts", "1",
                   "--abort-at-exit", "0"]
    await ctl.launch(LaunchSpec(script=TRAINER, args=args, max_restarts=2), preflight=False)
    final = await asyncio.wait_for(ctl.wait_done(), RUN_TIMEOUT)
    await ctl.stop_store()
    status = ctl.status()
    nodes = {n["name"]: n for n in status["nodes"]}
    rank0 = ctl.state.ranks[0].node
    other = next(n for n in nodes if n != rank0)

    assert final == "failed", status
    assert nodes[rank0]["state"] == "failed", nodes
    cause = nodes[rank0]["cause"]
    assert cause.startswith("rank 0 killed by SIGABRT (exit -6) after its last step (step 30)"), \
        cause
    assert nodes[other]["state"] == "exited" and nodes[other]["cause"] is None, nodes
    said = [e.text for e in ctl.state.events if e.kind == "ending"]
    assert any("rank 0 killed by SIGABRT" in t for t in said), said
    assert any("exit barrier" in t for t in said), said
    # the node's own record says so: a console attaching later replays the same end
    with open(os.path.join(node_dir(tmp_path / "work", ctl.run_id, rank0), "state.json")) as f:
        recorded = json.load(f)
    assert recorded["state"] == "failed" and recorded["cause"]["rank"] == 0, recorded
    assert "SIGABRT" in recorded["cause"]["message"]

    # --keep-ckpts 1: steps 10 and 20 were pruned by the trainer, step 30 is still there
    ckpts = [c for c in status["checkpoints"] if c["node"] == rank0]
    assert [(c["step"], c["exists"]) for c in ckpts] == [(10, False), (20, False), (30, True)], \
        ckpts
    assert all(os.path.exists(c["path"]) == c["exists"] for c in ckpts)
    deleted = [e for e in ctl.state.events if e.kind == "checkpoint deleted"]
    assert len(deleted) == 4, [e.text for e in deleted]  # two on each node
