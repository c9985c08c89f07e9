"""The host's record and its strays (agent/host/fleet.py, agent/serve/hosts.py), with real
supervisors (agent/node/ops.py ``start``) running a script in place of torchrun.

A node the verdict named in one run and cordoned in the next is flagged; the record is the
user's alone. A training process started outside rankdeck (a worker's environment) is a stray,
the live run's worker is not; ``kill_strays`` stops the stray by pid and start time only.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from agent.host import fleet, procs
from agent.node import fence as node_fence, folder as node, ops as node_ops
from agent.serve import hosts

from tests.waits import wait_for

SLEEP = "import time\nprint('up', flush=True)\ntime.sleep(120)\n"


def start(tmp_path, run_id):
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    (job / "sleep.py").write_text(SLEEP)
    args = {"run_root": str(tmp_path / ".rankdeck" / "runs" / run_id), "node": "n0"}
    node_ops.start(dict(args, spec={
        "run_id": run_id, "node": "n0", "argv": [sys.executable, "sleep.py"],
        "cwd": str(job), "env": {"RANK": "0", "LOCAL_RANK": "0", "SECRET_TOKEN": "x"}}))
    return args


async def running(args):
    ndir = node.node_dir(args)

    def up():
        state = node.node_state(ndir)
        return state and state.get("torchrun_pid") and state["alive"]
    return (await wait_for(up, 60, "the node to run"))


async def test_a_node_named_then_cordoned_is_flagged_and_strays_are_killed_by_pid(tmp_path):
    runs_dir = str(tmp_path / ".rankdeck" / "runs")
    first = start(tmp_path, "r1")
    await running(first)
    worker = node.node_state(node.node_dir(first))["torchrun_pid"]
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                              "--hf-token=hunter2"],
                             env=dict(os.environ, LOCAL_RANK="0", TORCHELASTIC_RUN_ID="x"))
    try:
        found = {s["pid"]: s for s in hosts.report({"runs_dir": runs_dir})["strays"]}
        assert stray.pid in found and worker not in found  # the live run's worker is ours
        assert found[stray.pid]["own"] and "hunter2" not in found[stray.pid]["cmd"]
        assert "--hf-token=****" in found[stray.pid]["cmd"]
        # a start time that is not the process's (a reused pid): refused, left alone
        wrong = hosts.kill_strays({"runs_dir": runs_dir, "grace": 1,
                                   "pids": [[stray.pid, found[stray.pid]["starttime"] + 1],
                                            [worker, procs.stat(worker).starttime]]})
        assert wrong["killed"] == [] and len(wrong["refused"]) == 2
        assert stray.poll() is None and procs.alive(worker)
        done = hosts.kill_strays({"runs_dir": runs_dir, "grace": 1,
                                  "pids": [[stray.pid, found[stray.pid]["starttime"]]]})
        assert done["killed"] == [stray.pid] and done["left"] == []
        stray.wait(10)
    finally:
        stray.kill()
        stray.wait()

    # run 1: the verdict named this node (the judge's --on-hang stop, agent/judge/policy.py)
    node_ops.stop(dict(first, end={"state": "failed", "cause": {
        "message": "stopped by --on-hang stop: rank 0 stuck", "named": True}}))
    record = fleet.read(runs_dir)
    assert [r["run_id"] for r in record["runs"]] == ["r1"]
    assert record["runs"][0]["nodes"]["n0"]["incidents"][0]["kind"] == "verdict"
    path = fleet.record_path(runs_dir)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert hosts.report({"runs_dir": runs_dir})["flagged"] is False

    # run 2: the judge's --on-hang restart named it (agent/judge/policy.py), then cordoned
    second = start(tmp_path, "r2")
    await running(second)
    node_ops.restart(dict(second, named="rank 0 stuck in python", timeout=60))
    await running(second)
    node_fence.fence(dict(second, fence={"who": "alice@laptop", "why": "cordoned by alice"}),
                     node_ops.stop)
    got = hosts.report({"runs_dir": runs_dir, "gpu": False})
    assert got["flagged"] is True and got["runs"] == ["r1", "r2"]
    assert [(i["run_id"], i["kind"]) for i in got["incidents"]] == \
        [("r1", "verdict"), ("r2", "verdict"), ("r2", "cordoned")]
    assert got["incidents"][1]["text"] == "rank 0 stuck in python"
    assert not any(s["pid"] == worker for s in got["strays"])
