"""`rankdeck hosts` over real SSH (sshhosts.py: 4 hosts that are not the laptop). A training
process started on a host outside rankdeck (the environment torchrun gives its workers) is
listed with its pid and masked command, and ``--kill-strays --yes`` stops it; another user's
(a ``torchrun`` of root's) is listed and left alone; a host whose record (agent/host/fleet.py's
file, in the form the agent writes it) has incidents in two runs is flagged.

Each test host has its own process table (sshhosts.py: a PID namespace per host), so a stray
is listed on the host it runs on and on no other, with the pid that host sees; the login
user's are those of ``rdkuser``.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from agent.rules import fleet as rules
from test_ssh_run import secret, write_inventory  # noqa: F401
from tests.cli import rankdeck  # noqa: E402
from tests.waits import wait_for_sync  # noqa: E402

pytestmark = pytest.mark.e2e


def record_with_two_bad_runs() -> str:
    record = None
    for i, kind in ((1, "verdict"), (2, None), (3, "gpu-error")):
        record = rules.add_run(record, "r%d" % i, "node3", {
            "state": "failed" if kind else "exited", "ended": 1000.0 + i,
            "incidents": [rules.incident(kind, "GPU 0 reported Xid 79" if kind == "gpu-error"
                                         else "named by the verdict")] if kind else []})
    return json.dumps(record)


def test_hosts_lists_strays_kills_the_users_own_and_flags_a_repeat_offender(
        ssh_hosts, clean_home, tmp_path, host_workdir, secret):
    (clean_home / ".ssh").mkdir(exist_ok=True)
    (clean_home / ".ssh" / "config").write_text(open(ssh_hosts.ssh_config).read())
    inv = write_inventory(tmp_path / "hosts.yaml", ssh_hosts, host_workdir)
    ssh_hosts.put_text("node3", host_workdir + "/.rankdeck/fleet.json",
                       record_with_two_bad_runs(), 0o600)
    stray = subprocess.Popen(ssh_hosts.command_on("node1", [
        "env", "LOCAL_RANK=0", "TORCHELASTIC_RUN_ID=stray", ssh_hosts.python, "-c",
        "import time; time.sleep(600)", "--hf-token=hunter2"]), stdin=subprocess.DEVNULL)
    theirs = subprocess.Popen(ssh_hosts.command_on("node2", [
        "bash", "-c", "exec -a torchrun sleep 600"], user=False), stdin=subprocess.DEVNULL)
    try:
        # the pids node1 and node2 see (what rankdeck reports), and this machine's
        stray_here = ssh_hosts["node1"].started(stray)
        theirs_here = ssh_hosts["node2"].started(theirs)
        stray_pid = ssh_hosts["node1"].ns_pid(stray_here)
        theirs_pid = ssh_hosts["node2"].ns_pid(theirs_here)
        assert stray_pid and theirs_pid and stray_pid != stray_here

        def listed():
            out = rankdeck("hosts", "-i", inv, "--json")
            assert out.returncode == 0, out.stdout + out.stderr
            rows = {r["name"]: r for r in json.loads(out.stdout)}
            return rows if (stray_pid in {s["pid"] for s in rows["node1"]["strays"]} and
                            theirs_pid in {s["pid"] for s in rows["node2"]["strays"]}) else None
        rows = wait_for_sync(listed, 60, "each stray listed on its host")
        assert sorted(rows) == ["node0", "node1", "node2", "node3"]
        assert all(r["reachable"] for r in rows.values())
        # each host lists its own stray and nothing of another host's
        assert [s["pid"] for s in rows["node1"]["strays"]] == [stray_pid], rows["node1"]
        assert [s["pid"] for s in rows["node2"]["strays"]] == [theirs_pid], rows["node2"]
        assert rows["node0"]["strays"] == [] and rows["node3"]["strays"] == [], rows
        mine = rows["node1"]["strays"][0]
        assert mine["own"] and mine["user"] == ssh_hosts.user
        assert "time.sleep(600)" in mine["cmd"] and "hunter2" not in mine["cmd"]
        root = rows["node2"]["strays"][0]
        assert (root["own"], root["user"], root["cmd"]) == (False, "root", "torchrun 600")
        assert rows["node3"]["flagged"] is True and not rows["node0"]["flagged"]
        assert [(i["run_id"], i["kind"]) for i in rows["node3"]["incidents"]] == \
            [("r1", "verdict"), ("r3", "gpu-error")]
        table = rankdeck("hosts", "-i", inv)
        assert "node3" in table.stdout and "FLAGGED" in table.stdout, table.stdout

        out = rankdeck("hosts", "-i", inv, "--kill-strays", "--yes")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "node1: stopped pid %d" % stray_pid in out.stdout, out.stdout
        assert out.stdout.count(": stopped pid ") == 1, out.stdout  # there, and only there
        assert "left alone (not the login user's): node2 root pid %d" % theirs_pid \
            in out.stdout, out.stdout
        assert stray.wait(30) is not None  # nsenter ends with the stray, its child
        assert not os.path.exists("/proc/%d" % stray_here)
        assert theirs.poll() is None  # root's: shown, never touched
        assert any("torchrun 600" in p for p in ssh_hosts.processes("node2"))
        assert not any("time.sleep(600)" in p for p in ssh_hosts.processes("node1"))
    finally:
        for proc in (stray, theirs):
            proc.kill()
            proc.wait()
