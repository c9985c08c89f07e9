"""Leaving a followed run is the RunController's, whichever view showed it (console/run/run.py
``leave``, ``exit_code`` and the launch's failure paths): a run that ended has its store
stopped, the status is saved, a failed launch marks the nodes it names failed and keeps its
own exit code. On scripted agents (tests/console/scripted.py), through the headless path."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from console.verbs.output import follow
from console.errors import LaunchError
from console.records.history import History
from console.run.run import RunController
from tests.console.scripted import (RUN_ID, ScriptedTransport, controller, event, host_names,
                                    inventory, standard_script)

HEADLESS = SimpleNamespace(no_tui=True, line_budget=64, by_node=False)  # `launch --no-tui`


def recorded(tmp_path) -> dict:
    return History(str(tmp_path / "history")).load(RUN_ID)


async def test_a_controller_that_launched_nothing_stops_and_leaves_without_raising(tmp_path):
    """`stop` on a controller that never launched (no spec yet): no AttributeError."""
    hosts = host_names(2)
    t = ScriptedTransport()
    async with RunController(inventory(str(tmp_path), 2), t,
                             History(str(tmp_path / "history"))) as ctl:
        assert await ctl.connect_all() == {}
        results = await ctl.stop()
        assert sorted(results) == hosts
        assert not any(isinstance(r, BaseException) for r in results.values()), results
        await ctl.leave()
        assert ctl.exit_code() == 0
    assert sorted(t.ops("stop")) == hosts


@pytest.mark.parametrize("states, code", [
    (("exited", "exited"), 0),  # succeeded
    (("exited", "failed"), 1),
    (("stopped", "exited"), 1),
    (("exited", "connected"), 0),  # it goes on: the console detached
])
def test_the_exit_code_says_how_the_run_went(tmp_path, states, code):
    ctl = RunController(inventory(str(tmp_path), 2), ScriptedTransport(),
                        History(str(tmp_path / "history")))
    for name, state in zip(host_names(2), states):
        ctl.state.set_node(name, state)
    assert ctl.exit_code() == code


async def test_a_failed_launch_exits_with_its_own_code(tmp_path):
    t = standard_script(host_names(2)).transport(unreachable={
        "node2": ("refused", "node2: connection refused (127.0.0.3:22)")})
    ctl, launch = controller(str(tmp_path), t, hosts=2)
    async with ctl:
        with pytest.raises(LaunchError):
            await follow(ctl, HEADLESS, launch)
    assert ctl.exit_code() == 3  # unreachable, docs: console/errors.py
    assert ctl.state.nodes["node2"].state == "unreachable"  # its own cause is kept


async def test_a_headless_launch_that_fails_marks_its_nodes_failed_as_the_tui_does(tmp_path):
    script = standard_script(host_names(3), t0=time.time())
    t = script.transport(refuse={("start", "node2"): "torchrun: not found"})
    ctl, launch = controller(str(tmp_path), t, hosts=3)
    async with ctl:
        with pytest.raises(LaunchError) as raised:
            await follow(ctl, HEADLESS, launch)
    assert raised.value.code == 1 and "could not start on node2" in str(raised.value)
    node2 = ctl.state.nodes["node2"]
    assert node2.state == "failed" and "torchrun: not found" in node2.cause
    assert sorted(t.ops("stop")) == ["node1", "node3"] and t.ops("store_stop") == ["node1"]
    assert ctl.exit_code() == 1
    assert recorded(tmp_path)["state"] == "failed"  # leaving did not write over it


async def test_a_store_that_never_serves_fails_the_launch_after_the_nodes_started(tmp_path):
    # the store is asked early (its port bound, its torch still loading) so the nodes start
    # beside it; a store that then cannot serve stops every node it started, and is the cause
    script = standard_script(host_names(3), t0=time.time())
    t = script.transport(refuse={("store_wait", "node1"): "the rendezvous store ended before "
                                 "it served: ModuleNotFoundError: No module named 'torch'"})
    ctl, launch = controller(str(tmp_path), t, hosts=3)
    async with ctl:
        with pytest.raises(LaunchError) as raised:
            await follow(ctl, HEADLESS, launch)
    said = str(raised.value)
    assert raised.value.code == 1 and "could not start on node1" in said, said
    assert "\n  node1: error: the rendezvous store ended before it served: " \
        "ModuleNotFoundError: No module named 'torch'" in said, said
    assert [r.args.get("early") for r in t.requests if r.op == "store_start"] == [True]
    assert sorted(t.ops("start")) == sorted(t.ops("stop")) == ["node1", "node2", "node3"]
    assert t.ops("store_stop") == ["node1"]
    assert recorded(tmp_path)["state"] == "failed"


async def test_leaving_a_run_that_ended_stops_its_store_and_saves_its_status(tmp_path, capsys):
    script = standard_script(host_names(2), t0=time.time())
    for node in host_names(2):
        script.recs[node].append([event("ended", time.time(), state="exited", exit_code=0)])
    t = script.transport()
    ctl, launch = controller(str(tmp_path), t, hosts=2)
    async with ctl:
        code = await asyncio.wait_for(follow(ctl, HEADLESS, launch), 60)
    assert code == 0 and "run %s: succeeded" % RUN_ID in capsys.readouterr().out
    assert t.ops("store_stop") == ["node1"]
    assert recorded(tmp_path)["status"]["state"] == "succeeded"


async def test_leaving_a_run_that_goes_on_saves_its_status_and_leaves_its_store(tmp_path):
    t = standard_script(host_names(2), t0=time.time()).transport()
    ctl, launch = controller(str(tmp_path), t, hosts=2)
    async with ctl:
        await launch()
        await ctl.caught_up()
        assert ctl.state.run_state() == "running"
        await ctl.leave()
        assert recorded(tmp_path)["status"]["state"] == "running"
    assert t.ops("store_stop") == [] and t.ops("stop") == []
    assert ctl.exit_code() == 0
