"""The job's import path is the user's, not the agent's (issue 29).

A real supervisor (agent/node/ops.py ``start``) runs a script in place of torchrun. The login's
PYTHONPATH holds a training package named ``agent``; the agent runs with its own folder first
on PYTHONPATH, and the job used to inherit that, so ``import agent`` gave rankdeck's. The
flight-recorder hook (agent/torchrun/frhook.py, loaded as ``sitecustomize``) must still load.
"""

from __future__ import annotations

import json
import os
import sys

from agent.node import folder as node, ops as node_ops

from tests.waits import wait_for

SCRIPT = """\
import json, os, sys, threading
import agent
import sitecustomize
print(json.dumps({"agent": getattr(agent, "NAME", agent.__file__),
                  "hook": sitecustomize.__file__,
                  "threads": [t.name for t in threading.enumerate()],
                  "path": os.environ.get("PYTHONPATH")}), flush=True)
"""


async def test_a_training_package_named_agent_is_the_jobs_own(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    (lib / "agent").mkdir(parents=True)
    (lib / "agent" / "__init__.py").write_text('NAME = "the training package"\n')
    monkeypatch.setenv("PYTHONPATH", str(lib))  # the login's, which serve's children inherit
    job = tmp_path / "job"
    job.mkdir()
    (job / "show.py").write_text(SCRIPT)
    run_root = tmp_path / "runs" / "r1"
    node_ops.start({"run_root": str(run_root), "node": "n0", "spec": {
        "run_id": "r1", "node": "n0", "argv": [sys.executable, "show.py"],
        "cwd": str(job), "env": {"RANK": "0", "LOCAL_RANK": "0"}}})
    ndir = run_root / "n0"

    def ended():
        state = node.node_state(str(ndir))
        return state and state["state"] not in node.LIVE_STATES and not state["alive"]
    await wait_for(ended, 60, "the job to end")
    output = (ndir / "torchrun.log").read_text()
    said = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    assert said["agent"] == "the training package", output
    assert said["path"].split(os.pathsep)[1:] == [str(lib)], said["path"]
    # the hook, from a folder of its own in the node's run folder, still runs in the rank
    assert said["hook"] == str(ndir / "frhook" / "sitecustomize.py"), said
    assert not os.path.exists(ndir / "frhook" / "agent")
    assert "rankdeck-fr" in said["threads"], said
    assert node.node_state(str(ndir))["exit_code"] == 0
