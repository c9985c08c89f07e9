"""Issue 40 (Low 9): under ``launch --auto-cordon`` a spare's start spec, secrets included,
waits on the judge's host in ``standby.json`` (agent/node/fence.py). It is written 0600, it
goes when the run's judge is stopped, and also when no judge runs any more (one killed
without its end left it), and docs/SECURITY.md's list of where secret values travel names it."""

from __future__ import annotations

import os
import stat

from agent.judge.control import stop_judge
from agent.node import fence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "hunter2-standby-secret"


def test_a_spare_s_kept_spec_is_private_and_goes_with_the_judge(tmp_path):
    run_root = str(tmp_path / "run")
    fence.standby({"run_root": run_root, "node": "spare0",
                   "spec": {"run_id": "r1", "argv": ["true"], "env": {"TOKEN": SECRET}}})
    path = os.path.join(run_root, "spare0", fence.STANDBY)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert SECRET in open(path).read()
    assert stop_judge(run_root) == {"stopped": False}  # no judge runs (killed earlier)
    assert not os.path.exists(path)


def test_security_md_names_where_the_secrets_wait_on_a_spare():
    with open(os.path.join(REPO, "docs", "SECURITY.md")) as f:
        text = f.read()
    travel = text[text.index("**Where secret values travel.**"):]
    travel = travel[:travel.index("\n\n")]
    assert fence.STANDBY in travel and "0600" in travel and "removed" in travel
