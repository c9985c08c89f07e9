"""A node's state as serve reads it four times a second (agent/node/folder.py ``node_state`` with the
subscription's ``seen``): state.json parsed again only once the supervisor replaced it, its
supervisor's life looked at every time."""

from __future__ import annotations

import os
import subprocess
import sys

from agent.node import folder as node
from agent.host import runfiles
from agent.host.procs import stat


def test_state_json_is_parsed_again_only_when_replaced_and_life_is_checked_each_time(
        tmp_path, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = tmp_path / "state.json"
        runfiles.write_json_atomic(str(path), {"state": "running", "pid": child.pid,
                                               "starttime": stat(child.pid).starttime})
        reads = []
        real = node.read_json
        monkeypatch.setattr(node, "read_json", lambda p, *a: reads.append(p) or real(p, *a))
        seen = {}
        first = node.node_state(str(tmp_path), seen)
        assert first["state"] == "running" and first["alive"] is True
        first["mutated"] = True  # the caller's copy: the next answer is not changed by it
        node.node_state(str(tmp_path), seen)
        again = node.node_state(str(tmp_path), seen)
        assert "mutated" not in again and again["alive"] is True
        assert len(reads) == 1  # three looks, one parse
        runfiles.write_json_atomic(str(path), dict(again, phase={"name": "workers"}))
        assert node.node_state(str(tmp_path), seen)["phase"] == {"name": "workers"}
        assert len(reads) == 2
        child.kill()
        child.wait()
        lost = node.node_state(str(tmp_path), seen)  # same file, its supervisor gone
        assert (lost["state"], lost["alive"], len(reads)) == ("lost", False, 2)
        os.unlink(path)
        assert node.node_state(str(tmp_path), seen) is None
    finally:
        child.kill()
        child.wait()
