"""The run's rendezvous store: a standalone torch TCPStore process on the rendezvous host.

Every node's torchrun joins the c10d rendezvous with ``is_host=false``, so the store does not
live inside any node's torchrun and a restart of the rendezvous host's node does not take the
whole job down (FACTS.md: "The c10d store lives in the torchrun of the rendezvous host").
The store runs with the host's training interpreter (it needs torch; the agent does not).
"""

import os
import subprocess
import sys
import time

from . import procs
from .runfiles import log_tail, read_json, write_json_atomic

STORE_SCRIPT = r"""
import json, os, sys, time
from torch.distributed import TCPStore
addr, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = TCPStore(addr, port, is_master=True, wait_for_workers=False)
info = {"pid": os.getpid(), "addr": addr, "port": store.port}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(info, f)
os.replace(tmp, path)
while True:
    time.sleep(3600)
"""


def store_path(run_root):
    return os.path.join(run_root, "store.json")


def running_store(run_root):
    """The store's info if its process is alive, else None."""
    info = read_json(store_path(run_root))
    if info and procs.alive(info.get("pid", -1), info.get("starttime")):
        return info
    return None


def start_store(run_root, addr, python, port=0, timeout=120.0):
    """Start the store (or return the running one). Raises RuntimeError with the store's log."""
    info = running_store(run_root)
    if info:
        return info
    os.makedirs(run_root, exist_ok=True)
    path = store_path(run_root)
    if os.path.exists(path):
        os.unlink(path)
    log = open(os.path.join(run_root, "store.log"), "ab")
    proc = subprocess.Popen(
        [python or sys.executable, "-c", STORE_SCRIPT, addr, str(port), path],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        cwd=run_root,
    )
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_json(path)
        if info:
            info["starttime"] = procs.stat(info["pid"]).starttime
            write_json_atomic(path, info)
            # Popen object is dropped: the store is a session leader of its own; the
            # serve process reaps it only if it ends while serve lives.
            return info
        if proc.poll() is not None:
            raise RuntimeError("rendezvous store failed to start (exit %s): %s" % (
                proc.returncode, log_tail(os.path.join(run_root, "store.log"))))
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("rendezvous store did not start within %d s" % timeout)


def stop_store(run_root):
    info = read_json(store_path(run_root))
    if not info:
        return {"stopped": False}
    pid = info.get("pid")
    if pid and procs.alive(pid, info.get("starttime")):
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while procs.alive(pid, info.get("starttime")) and time.monotonic() < deadline:
            procs.reap()
            time.sleep(0.05)
        if procs.alive(pid, info.get("starttime")):
            os.kill(pid, 9)
            time.sleep(0.1)
            procs.reap()
    return {"stopped": True, "pid": pid}
