"""A queued run (console/slurm/queued.py) is launched once when its follower and a `status`
look at the same moment: the launch holds the run's lock, the one that waited finds it
launched. Two real processes; the login host's answers and the launch are stand-ins (the
real ones: tests/slurm/test_slurm_run.py)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# one contender: the job runs; its launch takes a second and writes who launched
CONTENDER = """
import asyncio, sys, time
from console.slurm import queued as q
class T:
    async def close(self): pass
async def running(*_a): return {"state": "RUNNING", "reason": ""}
q.make_transport = lambda *_a: T()
q.load_inventory = lambda path: None
q.login_host = lambda inv: None
q.job_now = running
q.mark_submitted = lambda *_a: None
async def launch(args):
    with open(sys.argv[2], "a") as f:
        f.write("%s launched %s\\n" % (sys.argv[1], args.run_id_given))
    time.sleep(1.0)
print(asyncio.run(q.follow(sys.argv[3], launch)))
"""


def test_two_at_once_launch_the_queued_run_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    from console.slurm import queued as slurm_queued
    args = argparse.Namespace(sync=None, env=[], nodes=4)
    run_id = slurm_queued.keep(args, "41", "#!/bin/sh\n", str(tmp_path / "inv.yaml"))
    launches = tmp_path / "launches"
    env = dict(os.environ, PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, who, str(launches), run_id],
                              env=env, stdout=subprocess.PIPE, text=True)
             for who in ("follower", "status")]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs == ["None", "None"], outs
    lines = launches.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith("launched " + run_id), lines
    assert slurm_queued.queued(run_id) is None  # forgotten, its lock file too
    assert os.listdir(os.path.dirname(slurm_queued.queued_path(run_id))) == []
