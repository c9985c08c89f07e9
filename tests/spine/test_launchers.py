"""The spine checks under accelerate and DeepSpeed, with the real packages on CPU/gloo: two
local nodes of two ranks each, the reference trainer's Accelerate and DeepSpeed scripts.

One run per launcher: every rank named from its file's first byte and every byte of every
per-rank file delivered exactly once, checkpoints seen, who-is-stuck on a rank hung in Python,
a restart of that rank's node (under DeepSpeed, a static world: every node restarts, on a
fresh store's port) with every rank resuming from the checkpoint, and a stop that leaves
nothing.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections import defaultdict

import pytest

from agent.wire.protocol import text_to_bytes
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.model.summary import status_table
from console.transport.local import LocalTransport
from tests.waits import wait_for

from .helpers import REPO, TINY, local_inventory, processes_of, rank_log_files, wind_down

pytestmark = pytest.mark.e2e
TIMEOUT = 300
# DeepSpeed's and Accelerate's imports in 4 ranks and 2 launchers: minutes on a loaded 2-core
# machine before the first step
START_TIMEOUT = 600
SCRIPTS = {"accelerate": "accel_train.py", "deepspeed": "ds_train.py"}
DS_ENV = {"DS_ACCELERATOR": "cpu"}


def exactly_once(got, workdir, ctl) -> None:
    for node in ctl.state.nodes:
        files = rank_log_files(workdir, ctl.run_id, node)
        assert files, node
        for path in files:
            with open(path, "rb") as f:
                on_disk = f.read()
            chunks = got.get((node, path), [])
            offset = 0
            for start, data, _rank in chunks:
                assert start == offset, (path, start, offset)  # nothing skipped or sent twice
                offset += len(data)
            assert b"".join(d for _o, d, _r in chunks) == on_disk, path
            # named from the first byte: the rank printed in the file is the one its lines carry
            said = re.search(rb"^rank=(\d+) local_rank=", on_disk, re.M)
            if said:
                assert {r for _o, _d, r in chunks} == {int(said.group(1))}, (path, chunks[:1])


def not_installed(name: str):
    """Skip when ``name`` is not installed. Looked up, not imported (as importorskip would):
    importing accelerate, and DeepSpeed after it, costs this process torch's and their own
    start-up (6 CPU-seconds here) for nothing; the ranks import them, and fail loudly if
    they cannot."""
    return pytest.mark.skipif(importlib.util.find_spec(name) is None,
                              reason="%s is not installed" % name)


@not_installed("accelerate")
@pytest.mark.parametrize("launcher", [
    "accelerate", pytest.param("deepspeed", marks=not_installed("deepspeed"))])
async def test_spine_under_the_launcher(tmp_path, launcher):
    work = tmp_path / "work"
    ctl = RunController(local_inventory(work, n=2), LocalTransport(), History())
    got = defaultdict(list)
    ctl.state.line_listeners.append(lambda b: got[(b.node, b.path)].append(
        (b.offset, text_to_bytes(b.text), b.rank)))
    events = []
    ctl.state.event_listeners.append(events.append)
    script = os.path.join(REPO, "trainer", SCRIPTS[launcher])
    try:
        await ctl.launch(LaunchSpec(
            # --grace 2: the restart kills rank 3 (hung in Python) and its node's rank 2
            # (blocked in a collective), which never act on SIGTERM: the restart waits the
            # whole grace before its SIGKILL, for nothing (no step boundary comes to save at)
            script=script, nproc_per_node=2, max_restarts=2, grace=2, launch_with=launcher,
            stall_after=6.0,
            # DeepSpeed's ranks each load their part of a checkpoint: one folder for both nodes
            env=dict(DS_ENV, RANKDECK_CKPT_DIR=str(work / "ckpt")) if launcher == "deepspeed"
            else {},
            args=TINY + ["--steps", "100000", "--ckpt-every", "3", "--idle-s", "0.05",
                         "--hang-at-step", "12", "--hang-rank", "3", "--pg-timeout", "600"]),
            preflight=False)
        ranks = ctl.state.ranks
        await wait_for(lambda: len(ranks) == 4 and all((r.step or 0) >= 4 for r in ranks.values()),
                       START_TIMEOUT, "4 ranks past the step-3 checkpoint")
        assert any(e.kind == "checkpoint" and "step 3" in e.text for e in events), \
            [(e.kind, e.text) for e in events][-20:]

        # rank 3 hangs at step 12 (in Python, trainer/faults.py): the verdict names it
        await wait_for(lambda: all(r.state == "stalled" for r in ranks.values()), TIMEOUT,
                       "every rank stalled")
        verdict = await ctl.why()
        assert verdict["kind"] == "stuck-in-python", verdict
        assert [s["rank"] for s in verdict["suspects"]] == [3], verdict
        assert verdict["suspects"][0]["node"] == ctl.state.ranks[3].node

        endpoint = ctl.record["rdzv_endpoint"]
        res = await ctl.restart("node1")  # rank 3's node
        assert not any(isinstance(r, BaseException) for r in res.values()), res
        if launcher == "deepspeed":  # a static world: every node restarts, on a new port
            assert sorted(res) == ["node0", "node1"], res
            assert ctl.record["rdzv_endpoint"] != endpoint
            assert any(e.kind == "restarting" and "every node restarts" in e.text
                       for e in events), [(e.kind, e.text) for e in events][-20:]
        assert all(r["launches"] == 2 and r["restarts"] == 1 for r in res.values()), res

        def resumed():
            text = b"".join(d for chunks in got.values() for _o, d, _r in chunks).decode(
                "utf-8", "replace")
            return re.findall(r"resumed step=(\d+)", text)

        # every rank, past the hang (a fault fires once): the others' workers restart on the
        # membership change (accelerate), or with the whole world (DeepSpeed)
        await wait_for(lambda: len(resumed()) >= 4, TIMEOUT, "the ranks resumed")
        await wait_for(lambda: all((r.step or 0) > 12 for r in ranks.values()), TIMEOUT,
                       "every rank past the hang")

        results = await ctl.stop()
        assert all(not isinstance(r, BaseException) for r in results.values()), results
        assert all(r["state"] == "stopped" and r["left"] == [] for r in results.values()), \
            results
        assert processes_of(ctl.run_id) == []
        # the final table's phases say how each node ended, not its launcher's last phase
        # (issue 44: DeepSpeed's said `node0: workers running`)
        table = status_table(ctl.status())
        assert "\n  node0: ended (" in table and "workers running" not in table, table
        await ctl.stop_store()
        exactly_once(got, work, ctl)
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
