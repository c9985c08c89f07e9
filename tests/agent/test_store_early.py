"""The rendezvous store asked for early (agent/store/tcpstore.py): its answer comes once its
port is bound, before torch is imported, so a launch starts the nodes beside the store's
import; connections wait in the socket's backlog until it serves. Real store processes with
this machine's interpreters: the tests' own (with torch) and the system's (without)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from agent.store.tcpstore import running_store, start_store, stop_store, wait_ready
from tests.spine.helpers import HOST_PYTHON

NO_TORCH = shutil.which("python3", path="/usr/bin")
# a TCPStore client beside the store: set a key, read it back through the store
CLIENT = ("import sys; from datetime import timedelta; from torch.distributed import TCPStore; "
          "s = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=False, "
          "timeout=timedelta(seconds=60)); s.set('k', 'v'); print(s.get('k').decode())")


@pytest.fixture
def run_root(tmp_path):
    root = str(tmp_path / "run")
    yield root
    stop_store(root)


def test_an_early_store_takes_connections_at_once_and_serves_on_the_same_port(run_root):
    early = start_store(run_root, "127.0.0.1", HOST_PYTHON, early=True)
    port = early["port"]
    # a client started at once: its connection waits in the backlog while torch loads
    client = subprocess.Popen([HOST_PYTHON, "-c", CLIENT, str(port)], stdout=subprocess.PIPE,
                              text=True)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # bound and listening from the first answer on
        ready = wait_ready(run_root, timeout=120)
        assert ready["ready"] is True and ready["port"] == port, ready
        assert ready["pid"] == early["pid"] and ready["listens"] == "127.0.0.1:%d" % port
        assert ready["starttime"] == early["starttime"]  # written by the store itself
        assert oct(os.stat(os.path.join(run_root, "store.json")).st_mode & 0o777) == "0o600"
        assert client.communicate(timeout=120)[0].strip() == "v"
        # asked again (idempotent), early or not: the same store
        assert start_store(run_root, "127.0.0.1", HOST_PYTHON)["pid"] == early["pid"]
        assert start_store(run_root, "127.0.0.1", HOST_PYTHON, early=True)["pid"] == early["pid"]
    finally:
        client.kill()
        client.wait()


@pytest.mark.skipif(NO_TORCH is None, reason="no /usr/bin/python3 on this machine")
def test_a_store_whose_interpreter_has_no_torch_is_an_error_naming_why(run_root):
    if subprocess.run([NO_TORCH, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("/usr/bin/python3 has torch here")
    early = start_store(run_root, "127.0.0.1", NO_TORCH, early=True)  # bound before torch
    assert early["port"] > 0 and "ready" not in early, early
    with pytest.raises(RuntimeError) as err:
        wait_ready(run_root, timeout=60)
    assert "the rendezvous store ended before it served" in str(err.value)
    assert "No module named 'torch'" in str(err.value)
    assert running_store(run_root) is None
    with pytest.raises(RuntimeError) as err:  # not early: the same error from start_store
        start_store(run_root, "127.0.0.1", NO_TORCH)
    assert "No module named 'torch'" in str(err.value)
