"""Issue 40 ("Also"): `status` said `running` for a run nothing of which was left. A node
whose agent can read no state of it (no state.json, its folder even removed) and on whose
host no process of it runs is `gone`, with what is known; a run with no live node is not
`running`; `rankdeck ls` says when the state it shows was last seen. Real agents (the local
transport) answer; the journal is written by the agent's own writer."""

from __future__ import annotations

import json
import os
import time

from agent.host.journal import JournalWriter
from console.records.history import seen_text
from tests.cli import rankdeck, runs_folder

RUN = "20260101-000000-00dead"


def recorded(tmp_path):
    """A run of two nodes on this machine: node0 left a journal (a rank that stepped) but no
    state.json and no process; node1's run folder is gone."""
    hosts = [{"name": n, "addr": a, "python": "python3", "workdir": str(tmp_path)}
             for n, a in (("node0", "127.0.0.2"), ("node1", "127.0.0.3"))]
    record = {"run_id": RUN, "created": time.time() - 3600, "updated": time.time() - 1800,
              "transport": "local", "state": "running", "hosts": hosts,
              "spec": {"script": "train.py"},
              "status": {"nodes": [{"name": "node0", "state": "running", "ranks": []},
                                   {"name": "node1", "state": "starting", "ranks": []}]}}
    os.makedirs(runs_folder())
    with open(os.path.join(runs_folder(), RUN + ".json"), "w") as f:
        json.dump(record, f)
    node0 = tmp_path / ".rankdeck" / "runs" / RUN / "node0"
    node0.mkdir(parents=True)
    journal = JournalWriter(str(node0 / "journal"))
    now = time.time()
    journal.append({"k": "file", "f": 1, "rank": 0, "local_rank": 0, "attempt": 0,
                    "instance": "i", "stream": "stdout", "world_size": 2, "ts": now})
    journal.append({"k": "metric", "f": 1, "step": 5, "loss": 1.0, "ts": now})
    journal.close()


def test_a_run_nothing_of_which_is_left_is_not_running(tmp_path):
    recorded(tmp_path)
    out = rankdeck("status", RUN, "--json", timeout=120)
    assert out.returncode == 0, out
    status = json.loads(out.stdout)
    nodes = {n["name"]: n for n in status["nodes"]}
    assert status["state"] == "gone", status["state"]
    assert nodes["node0"]["state"] == "gone" and nodes["node1"]["state"] == "gone"
    assert "state.json" in nodes["node0"]["cause"] and "last seen running" in \
        nodes["node0"]["cause"], nodes["node0"]["cause"]
    assert "run folder" in nodes["node1"]["cause"] and "last seen starting" in \
        nodes["node1"]["cause"], nodes["node1"]["cause"]
    table = rankdeck("status", RUN, timeout=120)  # again: what the first one knew stays
    assert "gone" in table.stdout and "running" not in table.stdout.splitlines()[0]
    assert "last seen running" in table.stdout and "last seen starting" in table.stdout
    ls = rankdeck("ls")
    (line,) = [ln for ln in ls.stdout.splitlines() if ln.startswith(RUN)]
    assert "gone" in line and "(seen just now)" in line, line


def test_ls_says_when_the_state_it_shows_was_seen():
    now = 1_800_000_000.0
    assert seen_text({"updated": now - 30}, now) == "seen just now"
    assert seen_text({"updated": now - 1800}, now) == "seen 30 min ago"
    assert seen_text({"updated": now - 3 * 86400}, now) == "seen 3 d ago"
    assert seen_text({}, now) == "never seen"


def test_a_node_being_started_is_not_taken_for_gone(tmp_path):
    """Before its supervisor writes state.json the node has none, but the supervisor (which
    names the node's folder) is there: the agent counts it, so no console says `gone`."""
    import subprocess
    import sys

    from agent.node.folder import state_of
    args = {"run_root": str(tmp_path / "runs" / RUN), "node": "node0"}
    ndir = os.path.join(args["run_root"], "node0")
    assert state_of(args) == {"state": "missing", "folder": False, "procs": 0,
                              "journal_size": 0}
    os.makedirs(ndir)
    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", ndir])
    try:
        assert state_of(args)["procs"] == 1
    finally:
        starting.kill()
        starting.wait()
