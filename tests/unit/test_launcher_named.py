"""Issue 26: a run's causes, phases and events name the launcher that starts its nodes
(torchrun, deepspeed, accelerate), not torchrun whatever it is (docs/LAUNCHERS.md)."""

from __future__ import annotations

from console.launch.spec import LaunchSpec, launcher_name
from console.model.state import RunState
from console.model.summary import node_detail, status_table

NODES = [("node0", "10.0.0.1"), ("node1", "10.0.0.2")]


def state_of(launcher: str) -> RunState:
    state = RunState("run-1", NODES)
    state.launcher = launcher
    state.apply_records("node0", [[{"k": "event", "what": "launched", "pid": 7, "launch": 1,
                                    "ts": 1.0}]], 0)
    state.apply_supervisor_state("node0", {
        "state": "running", "phase": {"name": "stopping", "round": None,
                                      "note": "a rank exited with code 1", "since": 2.0}})
    return state


def test_the_phase_the_start_and_the_status_name_deepspeed():
    state = state_of("deepspeed")
    ns = state.nodes["node0"]
    assert node_detail(state, ns) == "deepspeed: stopping (a rank exited with code 1)"
    assert any(e.text == "deepspeed started (pid 7, launch 1)" for e in state.events)
    status = state.status()
    assert status["launcher"] == "deepspeed"
    table = status_table(status)
    assert "deepspeed:\n  node0: stopping (a rank exited with code 1)" in table
    assert "torchrun" not in table
    state.set_node("node1", "starting")  # no phase reported yet
    assert node_detail(state, state.nodes["node1"]) == "starting deepspeed"


def test_torchrun_stays_the_name_of_a_torchrun_run_and_a_raw_argv_is_the_launcher():
    assert node_detail(state_of("torchrun"), state_of("torchrun").nodes["node0"]) == \
        "torchrun: stopping (a rank exited with code 1)"
    assert launcher_name(LaunchSpec(script="t.py", launch_with="accelerate")) == "accelerate"
    assert launcher_name(LaunchSpec(script="t.py", launcher=["python", "-m", "x"])) == \
        "launcher"


def test_the_view_asks_before_restarting_every_node_of_a_static_world():
    from console.launch.spec import STATIC_WORLD_RESTART
    from console.tui.confirm import control_confirm
    asked = control_confirm("restart", "node1", "run-1", 2, STATIC_WORLD_RESTART["deepspeed"])
    assert asked.title_text == "Restart node node1?"
    assert asked.body.startswith("DeepSpeed's world is static: every node restarts. Kills the "
                                 "launcher on all 2 nodes")
    assert asked.action == "Restart every node"
    assert control_confirm("restart", "node1", "run-1", 2).action == "Restart node"


def test_an_ended_node_says_how_it_ended_not_its_last_phase():
    """Issue 44: a succeeded DeepSpeed run's table said ``node0: workers running``: the
    launcher's last phase its host sent was older than the node's end."""
    state = state_of("deepspeed")
    for node, code, what in (("node0", 0, "exited"), ("node1", 1, "failed")):
        state.apply_supervisor_state(node, {"state": "running", "phase": {
            "name": "workers running", "round": None, "note": None, "since": 3.0}})
        state.apply_records(node, [[{"k": "event", "what": "ended", "state": what,
                                     "exit_code": code, "ts": 9.0}]], 0)
    table = status_table(state.status())
    assert "deepspeed:\n  node0: ended (exit 0)\n  node1: ended (failed, exit 1)" in table
    assert "workers running" not in table
    assert state.status()["nodes"][0]["phase"]["name"] == "ended"
