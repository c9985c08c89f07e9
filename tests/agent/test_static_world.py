"""A static world's restart (DeepSpeed's launcher, agent/surgery/static_world.py): the new master port
reaches a node's live supervisor through its run folder, once, and replaces the launcher's
``--master_port``; a request with a port that is not one is refused before anything is done."""

from __future__ import annotations

import os

import pytest

from agent.node import ops as node_ops
from agent.surgery import static_world
from agent.wire.protocol import RequestError

ARGV = ["python", "-m", "deepspeed.launcher.runner", "--no_ssh", "--node_rank", "1",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "--master_port", "1"]


def test_the_port_left_for_a_restart_is_taken_once(tmp_path):
    assert static_world.take_master_port(str(tmp_path)) is None
    static_world.leave_master_port(str(tmp_path), "41157")
    assert static_world.take_master_port(str(tmp_path)) == 41157
    assert static_world.take_master_port(str(tmp_path)) is None  # not at a later restart
    (tmp_path / static_world.RESTART_WITH).write_text('{"master_port": 99999}')
    assert static_world.take_master_port(str(tmp_path)) is None  # no port: the argv stays
    assert not os.path.exists(tmp_path / static_world.RESTART_WITH)


def test_the_launchers_master_port_is_replaced_and_the_scripts_own_flag_kept():
    got = static_world.with_master_port(ARGV, 41157)
    assert got[got.index("--master_port") + 1] == "41157"
    assert got[-2:] == ["--master_port", "1"]  # the script's, after it: untouched
    assert static_world.with_master_port(["x", "--master_port=5"], 6) == ["x", "--master_port=6"]
    assert static_world.with_master_port(["torchrun", "t.py"], 6) == ["torchrun", "t.py"]


@pytest.mark.parametrize("bad", [0, 70000, "29500; rm -rf /", True, [1]])
def test_a_restart_with_a_port_that_is_not_one_is_refused(tmp_path, bad):
    with pytest.raises(RequestError, match="is not a TCP port") as err:
        node_ops.restart({"run_root": str(tmp_path), "node": "node0", "master_port": bad})
    assert err.value.kind == "usage"
    assert not os.path.exists(tmp_path / "node0" / static_world.RESTART_WITH)
