"""`rankdeck check --deep` on six real SSH hosts that are not the laptop (docs/HEALTH.md).

One host set for the module (setup is the expensive part): healthy, every host of the six
unnamed; then, on four of them (each host more is two torch imports more a check: the
preflight's and the probe's; four give every node fast links beside a slow one), one
host's link held to 50 Mbit/s with a token bucket (``tc ... tbf`` on both ends of its veth,
so both directions are slow), that host named and no other; the link between two hosts
alone held so, that link named (both its ends suspects) once each end was measured again
against a third host; one host's workdir a full tmpfs in its own mount namespace, that host
named for its disk; a launch with the deep preflight refused, or given a spare. The network
is measured by the run's own stack (torch point-to-point over gloo) from the hosts' own Python.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from tests.cli import rankdeck  # noqa: E402

try:
    from sshhosts import create_hosts, missing_requirements
except ImportError:  # tests/e2e made a package
    from .sshhosts import create_hosts, missing_requirements

pytestmark = pytest.mark.e2e
TIMEOUT = 300
RATE = "50mbit"
WORK = "~/proj-deep"


@pytest.fixture(scope="module")
def six_hosts():
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    hosts = create_hosts(6)
    try:
        hosts.mkdirs(WORK)
        yield hosts
    finally:
        hosts.close()


@pytest.fixture
def inventory(six_hosts, clean_home, tmp_path):
    ssh_dir = clean_home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(open(six_hosts.ssh_config).read())
    lines = ["transport: ssh", "defaults:", "  python: %s" % six_hosts.python,
             "  workdir: %s" % WORK, "hosts:"]
    for h in six_hosts.hosts:
        lines += ["  - name: %s" % h.name, "    ssh: %s" % h.name, "    addr: %s" % h.addr]
    path = tmp_path / "hosts.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def deep_check(inventory):
    start = time.monotonic()
    res = rankdeck("check", "--deep", "--json", "-i", inventory, timeout=TIMEOUT)
    took = time.monotonic() - start
    print("check --deep took %.1f s" % took)  # reported, never asserted
    doc = json.loads(res.stdout)
    return res.returncode, doc, {n["name"]: n for n in doc["nodes"]}


def tc(six_hosts, name, add: bool):
    h = six_hosts[name]
    verb = ["add"] if add else ["del"]
    shape = ["tbf", "rate", RATE, "burst", "64kb", "latency", "100ms"] if add else []
    six_hosts.run_in(name, ["tc", "qdisc", *verb, "dev", "eth0", "root", *shape], check=True)
    import subprocess
    subprocess.run(["tc", "qdisc", *verb, "dev", h.veth, "root", *shape], check=True,
                   capture_output=True)


def test_healthy_hosts_name_nobody(inventory):
    code, doc, nodes = deep_check(inventory)
    assert doc["suspects"] == [], doc
    assert code == 0
    assert doc["network"]["rounds"] == 3 and doc["network"]["every_pair"] == 15
    assert all(n["net_gbps"] and n["disk_write_mbps"] for n in nodes.values()), nodes


FOUR = ["node0", "node1", "node2", "node3"]


def test_a_host_behind_a_slow_link_and_one_with_a_full_disk_are_named_and_no_other(
        six_hosts, inventory):
    """One check for both (each check costs its hosts' torch imports): node3's link held to
    50 Mbit/s, node2's workdir a full tmpfs."""
    work = six_hosts.expand(WORK)
    pw = pwd.getpwnam(six_hosts.user)
    six_hosts.run_on("node2", ["mount", "-t", "tmpfs", "-o", "size=2m,uid=%d,gid=%d,mode=755"
                               % (pw.pw_uid, pw.pw_gid), "tmpfs", work], user=False, check=True)
    tc(six_hosts, "node3", True)
    try:
        six_hosts.run_on("node2", ["sh", "-c", "cat /dev/zero > %s/fill" % work])
        code, doc, nodes = deep_check(spare_inventory(inventory, None, FOUR))
    finally:
        tc(six_hosts, "node3", False)
        six_hosts.run_on("node2", ["umount", work], user=False, check=True)
    assert sorted(nodes) == FOUR, nodes
    assert doc["suspects"] == ["node2", "node3"], doc
    assert code == 1
    (problem,) = nodes["node3"]["problems"]
    assert problem.startswith("network: ") and "the median node" in problem
    assert nodes["node3"]["net_gbps"] < 0.1  # 50 Mbit/s
    assert any(p.startswith("disk: cannot write in %s" % work) for p in
               nodes["node2"]["problems"]), nodes["node2"]
    assert not any(p.startswith("network") for p in nodes["node2"]["problems"]), nodes["node2"]


def slow_link(six_hosts, a, b, add: bool):
    """The link between hosts ``a`` and ``b`` alone held to RATE both ways: on each one's
    eth0, traffic to the other goes to an htb class of that rate (this kernel has no prio
    qdisc); the rest to a class of 100 Gbit/s."""
    for src, dst in ((a, b), (b, a)):
        if not add:
            six_hosts.run_in(src, ["tc", "qdisc", "del", "dev", "eth0", "root"], check=True)
            continue
        for argv in (["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default",
                      "10"],
                     ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb",
                      "rate", "100gbit"],
                     ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:30", "htb",
                      "rate", RATE, "ceil", RATE],
                     ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32",
                      "match", "ip", "dst", six_hosts[dst].addr + "/32", "flowid", "1:30"]):
            six_hosts.run_in(src, ["tc", *argv], check=True)


def test_a_slow_link_is_named_as_a_link_after_a_recheck(six_hosts, inventory):
    slow_link(six_hosts, "node2", "node3", True)  # a pair of round 0 (2 XOR 1 = 3)
    try:
        code, doc, nodes = deep_check(spare_inventory(inventory, None, FOUR))
    finally:
        slow_link(six_hosts, "node2", "node3", False)
    assert sorted(nodes) == FOUR, nodes
    assert doc["network"]["recheck_rounds"] == 1, doc["network"]
    assert doc["suspects"] == ["node2", "node3"], doc
    assert code == 1
    assert [link[:2] for link in doc["network"]["slow_links"]] == [["node2", "node3"]]
    assert nodes["node2"]["problems"][0].startswith("network: the link to node3 ran ")
    assert nodes["node3"]["problems"][0].startswith("network: the link to node2 ran ")


def spare_inventory(inventory, spare, hosts=None):
    """The same hosts (only ``hosts``, when given), ``spare`` a spare (`spare: true`)."""
    lines = open(inventory).read().splitlines()
    if hosts is not None:
        lines = lines[:lines.index("hosts:") + 1] + [
            line for h in hosts for line in lines[lines.index("  - name: %s" % h):][:3]]
    if spare is not None:
        at = lines.index("  - name: %s" % spare)
        lines.insert(at + 1, "    spare: true")
    path = inventory.replace(".yaml", "-%s.yaml" % (spare or "subset"))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_launch_preflight_deep_refuses_a_slow_node_or_puts_a_spare_in(six_hosts, inventory,
                                                                      project):
    tiny = ["--", "--steps", "100000", "--d-model", "32", "--layers", "1", "--heads", "2",
            "--seq-len", "32", "--batch-size", "4", "--synthetic-samples", "2048"]
    # four hosts name node3 against the median node (a node's figure is its best link: every
    # other node has fast ones); each host fewer is two torch imports fewer (the preflight's
    # and the probe's) in each launch, and a node fewer to run
    tc(six_hosts, "node3", True)
    try:
        refused = rankdeck("launch", "--no-tui", "--preflight", "deep", "-i",
                           spare_inventory(inventory, None, FOUR), "--sync", str(project),
                           "trainer/train.py", *tiny, timeout=TIMEOUT)
        with_spare = spare_inventory(inventory, "node5", FOUR + ["node5"])
        launched = rankdeck("launch", "--detach", "--preflight", "deep", "-i", with_spare,
                            "--sync", str(project), "trainer/train.py", *tiny,
                            timeout=TIMEOUT)
    finally:
        tc(six_hosts, "node3", False)
    assert refused.returncode == 1, refused.stderr
    assert "the deep preflight names node3; nothing was started" in refused.stderr
    assert "node3: network: " in refused.stderr and "the median node" in refused.stderr
    assert launched.returncode == 0, launched.stderr
    run_id = launched.stdout.strip().splitlines()[-1]
    try:
        status = json.loads(rankdeck("status", run_id, "--json", timeout=TIMEOUT).stdout)
        states = {n["name"]: n["state"] for n in status["nodes"]}
        assert "node5" in states and states["node5"] != "spare", states
        assert states.get("node3") in (None, "preflight failed"), states
    finally:
        rankdeck("stop", run_id, timeout=TIMEOUT)
