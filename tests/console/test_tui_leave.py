"""Leaving the TUI: the terminal keeps what --no-tui would have printed (the run's status
table and each failed node's cause, secrets masked), and --sync progress is in the header."""

from __future__ import annotations

import time

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.tui.app import run_app
from inventory.model import EnvValue

from tests.waits import wait_until
from tests.console.scripted import (RUN_ID, controller, event, host_names, inventory,
                                    standard_script)

pytestmark = pytest.mark.usefixtures("own_home")

SIZE = (160, 48)
SECRET = "tok-3f9a0c1d2e4b5a69"


def secret_controller(tmp_path, transport):
    inv = inventory(str(tmp_path), 2, 2)
    for h in inv.hosts:
        h.env = {"API_TOKEN": EnvValue(SECRET, True)}
    ctl = RunController(inv, transport, History(str(tmp_path / "history")), run_id=RUN_ID)
    spec = LaunchSpec(script="train.py", args=["--steps", "40"], nproc_per_node=2, grace=1.0)
    return ctl, lambda: ctl.launch(spec, inventory_path="")


async def test_q_after_a_failed_run_prints_the_summary_and_the_masked_cause(tmp_path, capsys):
    hosts = host_names(2)
    script = standard_script(hosts, t0=time.time())
    script.crash("node2", 1, 1, "credential %s rejected" % SECRET, time.time() + 30)
    script.recs["node1"].append([event("ended", time.time() + 40, state="failed",
                                       exit_code=1, cause={"message": "peer node2 left"})])
    t = script.transport()
    ctl, launch = secret_controller(tmp_path, t)

    async def leave_once_failed(pilot):
        await wait_until(pilot, lambda: ctl.state.run_state() == "failed", what="run to fail")
        await pilot.press("q")

    code = await run_app(ctl, launch, headless=True, size=SIZE, auto_pilot=leave_once_failed)
    out, err = capsys.readouterr()
    assert code == 1
    assert "run %s: failed" % RUN_ID in out
    assert "causes:" in out
    assert "node2: rank 3 (local 1) exited with code 1: RuntimeError: credential **** " \
        "rejected" in out
    assert SECRET not in out + err
    assert "rankdeck attach" not in err  # nothing to attach to: the run is over


async def test_quit_while_running_prints_the_detach_hint_not_a_summary(tmp_path, capsys):
    script = standard_script(host_names(2), t0=time.time())
    ctl, launch = secret_controller(tmp_path, script.transport())

    async def leave_running(pilot):
        await wait_until(pilot, lambda: not pilot.app.launching and ctl.state.ranks, what="launch")
        await pilot.press("q")

    code = await run_app(ctl, launch, headless=True, size=SIZE, auto_pilot=leave_running)
    out, err = capsys.readouterr()
    assert code == 0
    assert "rankdeck attach %s" % RUN_ID in err and "causes:" not in out


async def test_a_failed_start_shows_the_node_failed_and_exits_with_the_launch_code(tmp_path,
                                                                                   capsys):
    """The controller marks the node (tests/unit/test_leave.py: the headless path alike);
    the nodes table shows it, and the terminal keeps the launch's error."""
    script = standard_script(host_names(3), t0=time.time())
    t = script.transport(refuse={("start", "node2"): "torchrun: not found"})
    ctl, launch = controller(str(tmp_path), t, hosts=3)

    async def leave_once_failed(pilot):
        nodes = pilot.app.nodes
        await wait_until(pilot, lambda: not pilot.app.launching, what="launch to fail")
        await wait_until(pilot, lambda: (nodes.row_values("n:node2") or ("", ""))[1] == "failed",
                         what="node2 failed in the nodes table")
        assert "torchrun: not found" in nodes.row_values("n:node2")[-1]
        await pilot.press("q")

    async with ctl:
        code = await run_app(ctl, launch, headless=True, size=SIZE, auto_pilot=leave_once_failed)
    assert code == 1
    assert "launch failed: could not start on node2" in capsys.readouterr().err


async def test_header_shows_sync_progress_while_code_is_sent(tmp_path):
    from console.tui.app import RankdeckApp

    script = standard_script(host_names(2), t0=time.time())
    ctl, launch = secret_controller(tmp_path, script.transport(hold=("open",)))
    app = RankdeckApp(ctl, launch)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.launching and ctl.sync_listeners, what="launch")
        for listener in ctl.sync_listeners:  # as RunController reports a --sync
            listener("sync: node1 3/40 files 1.0/8.0 MB \u00b7 node2 checking", False)
        assert "sync: node1 3/40 files 1.0/8.0 MB" in app.header.info().plain
        for listener in ctl.sync_listeners:
            listener("sync: node1 40/40 files 8.0/8.0 MB done", True)
        assert "sync:" not in app.header.info().plain
        t = ctl.transport
        t.release()
        await wait_until(pilot, lambda: not app.launching, what="launch to end")
