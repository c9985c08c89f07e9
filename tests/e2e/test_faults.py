"""Twenty kill/restart cycles over real SSH, then a stop that must leave nothing behind.

Four OpenSSH hosts in network namespaces (``ssh_hosts``), the reference trainer under real
torchrun. Cycles go round the nodes and alternate ``restart(node)`` (the supervisor kills
torchrun and starts it again) with ``stop(node)`` then ``restart(node)`` (a new supervisor).
Each is verified: the node's ``launches`` went up and no process of the killed torchrun is
left. After the stop: no process of the run, no listening port the run opened, no temporary
folder or file of the run.

The hosts share this machine's filesystem and process table, so /proc and /tmp are read
directly; ports are read inside each namespace.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time

import pytest

from agent import procs
from console.history import History
from console.run import LaunchSpec, RunController
from console.transport.ssh import SshTransport
from inventory.model import Host, Inventory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY, TRAINER, processes_of, wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT = 300
CYCLES = 20
RECOVER_EVERY = 5  # cycles 5, 10 and 15 wait for the job to train again first
CLK = os.sysconf("SC_CLK_TCK")
TMP_DIRS = ("/tmp", "/dev/shm")


def stepping_since(ctl: RunController, since: float) -> bool:
    """Every one of the 4 ranks has made a step since ``since`` (wall clock)."""
    ranks = ctl.state.ranks
    return len(ranks) == 4 and all((r.last_progress or 0) > since for r in ranks.values())


def marked(run_id: str, node: str) -> dict[int, int]:
    """{pid: starttime} of the live processes carrying RANKDECK_RUN=<run_id>/<node>."""
    table = procs.table()
    return {pid: table[pid].starttime for pid in procs.marked("%s/%s" % (run_id, node), table)
            if table[pid].state != "Z"}


def boot_ticks() -> int:
    """Now, in /proc/<pid>/stat starttime units (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLK)


def still_there(old: dict[int, int]) -> list[int]:
    return [pid for pid, start in old.items() if procs.alive(pid, start)]


def listening(ssh_hosts) -> dict[str, set[str]]:
    """Every host's listening TCP sockets: {host: {"addr:port process", ...}}."""
    out = {}
    for name in ssh_hosts.names:
        res = ssh_hosts.run_in(name, ["ss", "-ltnpH"], timeout=60)
        assert res.returncode == 0, res.stderr
        found = set()
        for line in res.stdout.splitlines():
            cols = line.split()
            if len(cols) < 4:
                continue
            who = re.search(r'\(\("([^"]*)"', line)
            found.add("%s %s" % (cols[3], who.group(1) if who else "?"))
        out[name] = found
    return out


def tmp_entries() -> set[str]:
    out = set()
    for d in TMP_DIRS:
        try:
            out.update(os.path.join(d, n) for n in os.listdir(d))
        except OSError:
            pass
    return out


def names_under(path: str, depth: int = 3) -> list[str]:
    """Names of the entries below ``path`` (a few levels), to tell whose a folder is."""
    if not os.path.isdir(path) or os.path.islink(path):
        return []
    found = []
    try:
        for entry in os.scandir(path):
            found.append(entry.name)
            if depth > 1 and entry.is_dir(follow_symlinks=False):
                found.extend(names_under(entry.path, depth - 1))
    except OSError:
        pass
    return found


def left_in_tmp(before: set[str], run_id: str) -> tuple[list[str], list[str]]:
    """New entries in /tmp and /dev/shm: (the run's, others') - pytest's own are ignored.

    The machine is shared, so a new entry is the run's when its name or a name inside it
    carries the run id, or when it is a torchelastic_* folder (torchrun makes one only without
    --log-dir, and rankdeck always passes one). Other rankdeck-named entries (a benchmark
    running beside the test) are not the run's.
    """
    ours, others = [], []
    for path in sorted(tmp_entries() - before):
        name = os.path.basename(path)
        if name.startswith("pytest-of-"):
            continue
        inside = names_under(path)
        if (name.startswith("torchelastic_") or run_id in name
                or any(run_id in n for n in inside)):
            ours.append("%s %s" % (path, inside[:5]))
        else:
            others.append(path)
    return ours, others


def temp_files_in(folder: str) -> list[str]:
    """Atomic-write leftovers (``x.tmp``, ``x.tmp.<pid>``) anywhere under a run folder."""
    out = []
    for root, _dirs, files in os.walk(folder):
        out.extend(os.path.join(root, f) for f in files if re.search(r"\.tmp(\.\d+)?$", f))
    return out


async def test_twenty_restart_cycles_over_ssh_then_stop_leaves_nothing(ssh_hosts, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    hosts = [Host(name=h.name, addr=h.addr, ssh=h.name, python=sys.executable,
                  workdir=str(work)) for h in ssh_hosts.hosts]
    inv = Inventory(path="<test>", hosts=hosts, transport="ssh")
    transport = SshTransport(ssh_config=ssh_hosts.ssh_config, known_hosts=ssh_hosts.known_hosts,
                             client_keys=[ssh_hosts.client_key],
                             remote_cache=ssh_hosts.remote_cache)
    ports_before = listening(ssh_hosts)
    tmp_before = tmp_entries()
    ctl = RunController(inv, transport, History())
    run_id = ctl.run_id
    names = [h.name for h in hosts]
    log = []
    t0 = time.monotonic()
    try:
        # max_restarts: a node restart makes the other nodes' workers stop too (they agree
        # to stop, exit 143), which torchrun counts as a failure on those nodes.
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=100, grace=3,
                                    args=TINY + ["--steps", "100000", "--term-grace", "2"]))
        ranks = ctl.state.ranks
        await wait_for(lambda: len(ranks) == 4 and all((r.step or 0) >= 2
                                                       for r in ranks.values()),
                       TIMEOUT, "every rank stepping")
        t_stepping = time.monotonic()
        launches = {n: 1 for n in names}
        last_ack = time.time()
        for i in range(CYCLES):
            node = names[i % len(names)]
            kind = "restart" if i % 2 == 0 else "stop+restart"
            if i % RECOVER_EVERY == 0 and i:
                # now and then the job recovers first, so that the kill hits live workers
                # mid-training; the other cycles kill whatever is there at that moment
                await wait_for(lambda: stepping_since(ctl, last_ack), TIMEOUT,
                               "every rank stepping again before cycle %d" % i)
            old = marked(run_id, node)
            workers = [p for p in old if "RANK" in procs.environ(p)]
            if i % RECOVER_EVERY == 0:
                assert workers, (i, node, "no worker to kill after recovery", old)
            started = time.monotonic()
            since = boot_ticks()
            if kind == "stop+restart":
                stopped = (await ctl.stop(node))[node]
                assert not isinstance(stopped, BaseException), (i, node, stopped)
                assert stopped["state"] == "stopped" and stopped["left"] == [], (i, stopped)
                assert not stopped["alive"]
                assert marked(run_id, node) == {}, (i, node, "processes after stop")
            res = (await ctl.restart(node))[node]
            took = time.monotonic() - started
            assert not isinstance(res, BaseException), (i, node, kind, res)
            assert res["launches"] > launches[node], (i, node, kind, res, launches)
            assert res["alive"] and res["state"] == "running", (i, node, kind, res)
            launches[node] = res["launches"]
            # nothing of the killed torchrun is left: neither what ran before the request
            # nor anything else of the node's run that started before it
            assert still_there(old) == [], (i, node, kind, old, still_there(old))
            older = {p: s for p, s in marked(run_id, node).items() if s < since - 1}
            assert older == {}, (i, node, kind, "started before the restart", older)
            last_ack = time.time()
            log.append((i, node, kind, len(old), took))
        t_cycles = time.monotonic()
        # after all that the run still trains: every rank steps again
        await wait_for(lambda: stepping_since(ctl, last_ack), TIMEOUT,
                       "every rank stepping again after %d cycles" % CYCLES)
        t_recovered = time.monotonic()

        results = await ctl.stop()
        t_stopped = time.monotonic()
        assert all(not isinstance(r, BaseException) for r in results.values()), results
        assert all(r["state"] == "stopped" and r["left"] == [] for r in results.values()), \
            results
    finally:
        if any(l.stream is not None for l in ctl.links.values()) and \
                ctl.state.run_state() not in ("stopped", "failed", "succeeded"):
            await ctl.stop()
        await ctl.close()
        left = processes_of(run_id)
        for pid, _cmd in left:  # never leave a run behind, even when the test failed
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    print("\nlaunch to stepping %.1f s; %d cycles %.1f s (%s); recovered in %.1f s; stop "
          "%.1f s" % (t_stepping - t0, CYCLES, t_cycles - t_stepping,
                      ", ".join("%s %s %.1fs/%d procs" % (n, k[:4], s, c)
                                for _i, n, k, c, s in log),
                      t_recovered - t_cycles, t_stopped - t_recovered), file=sys.stderr)
    assert all(count > 0 for _i, _n, _k, count, _s in log[len(names):]), (
        "a cycle found no process of the node's run to kill", log)

    # no process of the run, on any host
    assert left == [], "processes left behind: %s" % left
    # no listening port the run opened (the serves exit with their SSH channels: wait a bit)
    deadline = time.monotonic() + 60
    while listening(ssh_hosts) != ports_before and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    ports_after = listening(ssh_hosts)
    for name in names:
        assert ports_after[name] == ports_before[name], (
            name, "new:", ports_after[name] - ports_before[name],
            "gone:", ports_before[name] - ports_after[name])
    # no temporary folder or file of the run
    ours, others = left_in_tmp(tmp_before, run_id)
    if others:
        print("new in /tmp, not the run's (the machine is shared): %s" % others,
              file=sys.stderr)
    assert ours == [], "temporary files of the run left behind: %s" % ours
    run_dir = work / ".rankdeck" / "runs" / run_id
    assert run_dir.is_dir()
    assert temp_files_in(str(run_dir)) == []
