"""What a launch checks before anything starts: the code sent with --sync took on every host
(real agents over the local transport), and the preflight's host-side facts (the script is
there, the workdir writable, the python found) refuse a bad spec with exit 2 and the fix."""

from __future__ import annotations

import os
import time

import pytest

from console.errors import EXIT_FAILED, EXIT_USAGE, LaunchError
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.model.summary import status_table
from console.transport.local import LocalTransport
from inventory.model import Inventory

from tests.console.scripted import RUN_ID, host_names, inventory, standard_script
from tests.local_nodes import local_inventory


def scripted(tmp_path, facts: dict):
    t = standard_script(host_names(2), t0=time.time()).transport(facts=facts)
    inv = inventory(str(tmp_path), 2, 1)
    return RunController(inv, t, History(str(tmp_path / "history")), run_id=RUN_ID), t


async def launch_refused(ctl) -> LaunchError:
    with pytest.raises(LaunchError) as err:
        await ctl.launch(LaunchSpec(script="train.py"))
    return err.value


async def test_a_script_missing_on_a_host_is_exit_2_and_nothing_starts(tmp_path):
    ctl, t = scripted(tmp_path, {"node2": {"script": "/home/u/proj/train.py",
                                           "script_module": False, "script_exists": False}})
    err = await launch_refused(ctl)
    assert err.code == EXIT_USAGE
    assert "node2: script /home/u/proj/train.py is not on the host: use `rankdeck launch " \
        "--sync DIR` to send your code, or put it there" in str(err)
    assert "node1:" not in str(err).split("verdict", 1)[1]  # node1 has it: not named
    assert [r.args.get("script") for r in t.requests if r.op == "preflight"] == ["train.py"] * 2
    assert t.ops("store_start") == [] and t.ops("start") == []
    assert ctl.state.nodes["node2"].state == "preflight failed"
    assert not os.path.exists(History(str(tmp_path / "history")).path(RUN_ID))


@pytest.mark.parametrize("facts, said", [
    ({"workdir": "/home/u/proj", "workdir_exists": True, "workdir_writable": False},
     "node1: workdir /home/u/proj is not writable by the login user"),
    ({"workdir": "/home/u/proj", "workdir_exists": False, "workdir_writable": False},
     "node1: workdir /home/u/proj does not exist on the host; create it, or use `rankdeck "
     "launch --sync DIR`"),
    ({"python_exists": False, "python_path": None},
     "node1: python %s does not exist on the host; set `python:` for this host"),
    ({"script": "pkg.train", "script_module": True, "script_exists": False,
      "python_path": "/opt/venv/bin/python", "workdir": "/home/u/proj"},
     "node1: module pkg.train not found by /opt/venv/bin/python from workdir /home/u/proj"),
])
async def test_paths_the_host_lacks_are_exit_2_with_the_fix(tmp_path, facts, said):
    ctl, t = scripted(tmp_path, {"node1": facts})
    err = await launch_refused(ctl)
    assert err.code == EXIT_USAGE
    assert (said % ctl.inventory.host("node1").python if "%s" in said else said) in str(err)
    assert t.ops("start") == []


async def test_check_before_the_first_launch_only_warns_of_a_missing_workdir(tmp_path):
    # `rankdeck check` on fresh hosts: `launch --sync` will make the workdir
    ctl, t = scripted(tmp_path, {"node1": {"workdir": "/home/u/proj", "workdir_exists": False}})
    async with ctl:
        await ctl.connect_all()
        checks = {c.name: c for c in await ctl.preflight()}
    assert checks["node1"].ok and not checks["node1"].problems
    assert checks["node1"].warnings == [
        "workdir /home/u/proj is not there yet; `rankdeck launch --sync DIR` creates it"]


async def test_a_host_problem_that_is_not_a_path_stays_exit_1(tmp_path):
    ctl, t = scripted(tmp_path, {"node2": {"torch": "2.0.0"}})
    err = await launch_refused(ctl)
    assert err.code == EXIT_FAILED and "torch 2.0.0 differs" in str(err)


async def test_an_agent_without_the_new_facts_is_not_judged_on_them(tmp_path):
    ctl, t = scripted(tmp_path, {})  # the scripted agent sends no workdir_writable etc.
    await ctl.launch(LaunchSpec(script="train.py"))
    assert t.ops("start") == ["node1", "node2"]
    await ctl.close()


# -- --sync through real agents (local transport; fails before torchrun would start) ----------
def two_hosts(workdir) -> Inventory:
    """Two local nodes, each its own workdir (not made)."""
    return local_inventory([workdir / ("host%d" % i) for i in range(2)], 2)


async def test_a_host_that_cannot_take_the_code_fails_the_launch_naming_it(tmp_path):
    tree = tmp_path / "code"
    tree.mkdir()
    (tree / "train.py").write_text("print('hi')\n")
    (tree / "data").write_text("a file in the tree\n")
    inv = two_hosts(tmp_path)
    os.makedirs(inv.hosts[1].workdir + "/data")  # node1 has a folder where the tree has a file
    with open(inv.hosts[1].workdir + "/data/keep.txt", "w") as f:
        f.write("the user's own file\n")
    os.makedirs(inv.hosts[0].workdir)
    ctl = RunController(inv, LocalTransport(), History(str(tmp_path / "history")))
    lines = []
    ctl.sync_listeners.append(lambda line, final: lines.append((line, final)))
    with pytest.raises(LaunchError) as err:
        await ctl.launch(LaunchSpec(script="train.py", sync=str(tree)))
    message = str(err.value)
    assert err.value.code == EXIT_FAILED
    assert "could not send %s to 1 of 2 hosts; nothing was started" % tree in message
    assert "node1: conflict:" in message and "node0" not in message
    assert ctl.state.nodes["node1"].state == "sync failed"
    assert lines and lines[-1][1] and lines[-1][0].startswith("sync: node0 ")
    # nothing started, no run recorded; the user's file is still there
    assert not os.path.exists(os.path.join(inv.hosts[1].workdir, ".rankdeck", "runs"))
    assert not os.path.isdir(str(tmp_path / "history"))
    with open(inv.hosts[1].workdir + "/data/keep.txt") as f:
        assert f.read() == "the user's own file\n"


def test_status_shows_the_tree_sent(tmp_path):
    ctl = RunController(two_hosts(tmp_path), LocalTransport(),
                        History(str(tmp_path / "history")))
    ctl.record = {"sync": {"tree": "3f9a0c1d2e4b" + "0" * 52, "dir": "/home/me/proj",
                           "files": 112, "bytes": 4200000, "source": "git"}}
    status = ctl.status()
    assert status["sync"]["tree"].startswith("3f9a0c1d2e4b")
    assert status_table(status).split("\n")[1] == \
        "code: tree 3f9a0c1d2e4b (112 files, 4.2 MB) from /home/me/proj"
    ctl.record = {}
    assert ctl.status()["sync"] is None and "code:" not in status_table(ctl.status())
