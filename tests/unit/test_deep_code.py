"""Issue 42: the deep check compares the code a launch synced (``--sync``: the manifest's tree
hash) on every node and names a node whose code differs; with no sync it says nothing about
code. The rule on its own, then through real agents over the local transport: a tree synced
to three workdirs, one file changed on one node, another tree on another."""

from __future__ import annotations

import os

from console.launch.sync import build_manifest, sync_hosts
from console.records.history import History
from console.run import deep
from console.run.preflight import HostCheck
from console.run.run import RunController
from console.transport.local import LocalTransport
from tests.local_nodes import local_inventory

TREE = "ab" * 32
OTHER = "cd" * 32


def test_the_rule_names_the_node_whose_code_differs_and_no_other():
    checks = [HostCheck(n) for n in ("node0", "node1", "node2", "node3", "node4")]
    checks.append(HostCheck("node5", reachable=False, cause="unreachable"))
    deep.judge_code(checks, TREE, {
        "node0": {"same": True, "workdir": "/w", "tree": TREE},
        "node1": {"same": False, "workdir": "/w", "tree": TREE},
        "node2": {"same": False, "workdir": "/w", "tree": OTHER},
        "node3": {"same": False, "workdir": "/w", "tree": None},
        "node4": RuntimeError("agent went away"),
    })
    said = {c.name: c.problems for c in checks}
    assert said["node0"] == [] and said["node5"] == []
    assert said["node1"] == ["code: a file of tree abababababab in /w changed since the sync"]
    assert said["node2"] == ["code: /w holds tree cdcdcdcdcdcd, not the synced tree "
                             "abababababab"]
    assert said["node3"] == ["code: /w holds no tree rankdeck placed, not the synced tree "
                             "abababababab"]
    assert said["node4"] == ["code: not compared with the synced tree abababababab: agent "
                             "went away"]
    assert [deep.kind_of(p[0]) for p in (said["node1"], said["node2"])] == ["code", "code"]


def test_a_host_tree_that_is_no_hash_is_not_printed():
    c = HostCheck("node0")
    deep.judge_code([c], TREE, {"node0": {"same": False, "workdir": "/w\x1b[2J",
                                          "tree": "\x1b[31m" + "x" * 5000}})
    assert c.problems[0].startswith("code: /w") and c.problems[0].endswith(
        " holds no tree rankdeck placed, not the synced tree abababababab")
    assert "xxxx" not in c.problems[0] and "\x1b" not in c.problems[0]


async def test_real_agents_name_the_node_whose_code_differs(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('step')\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("print('another trainer')\n")
    workdirs = [tmp_path / ("host%d" % i) for i in range(4)]
    for w in workdirs:
        w.mkdir()
    inv = local_inventory(workdirs, 4)
    ctl = RunController(inv, LocalTransport(), History(str(tmp_path / "history")))
    manifest = build_manifest(str(code), False)
    async with ctl:
        assert not await ctl.connect_all()

        def call(name):
            return lambda op, args: ctl.links[name].request(op, timeout=60, **args)
        synced = await sync_hosts({n: call(n) for n in ("node0", "node1")}, manifest,
                                  {h.name: h.workdir for h in inv.hosts})
        assert not any(isinstance(r, BaseException) for r in synced.values()), synced
        placed = await sync_hosts({"node2": call("node2")}, build_manifest(str(other), False),
                                  {"node2": inv.hosts[2].workdir})
        assert not isinstance(placed["node2"], BaseException), placed
        # node1's trainer edited in place after the sync (a later size and mtime)
        with open(os.path.join(workdirs[1], "train.py"), "a") as f:
            f.write("print('edited on the host')\n")
        checks = [HostCheck(h.name) for h in inv.hosts]
        deep.judge_code(checks, manifest.tree, await deep.same_code(ctl, checks,
                                                                    manifest.tree))
    said = {c.name: c.problems for c in checks}
    tree = manifest.tree[:12]
    assert said["node0"] == []
    assert said["node1"] == ["code: a file of tree %s in %s changed since the sync"
                             % (tree, workdirs[1])]
    assert said["node2"] == ["code: %s holds tree %s, not the synced tree %s"
                             % (workdirs[2], build_manifest(str(other), False).tree[:12], tree)]
    assert said["node3"] == ["code: %s holds no tree rankdeck placed, not the synced tree %s"
                             % (workdirs[3], tree)]
