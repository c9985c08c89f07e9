"""Real training over real SSH: 4 hosts that are not the laptop, the reference trainer, torchrun.

Each host has its own home, /tmp, login user and Python (see sshhosts.py); they share only
this machine's process table. As in the field, every run's workdir is a ``~/proj-...`` path
read on the host, and the trainer gets there by ``--sync`` of a laptop folder (``project``).
A test reads a host's run folder through ``local_path`` and /proc directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict

import pytest

from agent.host import procs
from agent.wire.protocol import text_to_bytes
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.model.sources import RANK, fids_of
from console.transport.ssh import SshTransport
from inventory.loader import load_inventory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY, processes_of, rank_log_files, wind_down  # noqa: E402
from tests.cli import rankdeck, start_rankdeck  # noqa: E402
from tests.waits import wait_for, wait_for_sync  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT = 300
SCRIPT = "trainer/train.py"  # in the workdir, where --sync puts the project


def write_inventory(path, ssh_hosts, workdir, addrs=None, pythons=None, n=4):
    """An inventory of the first ``n`` of the 4 hosts with ``workdir`` (a ``~/proj-...``
    path, read on each host) and one secret in every rank's environment. Each node more is
    its torchrun's and worker's start-up, a test's time: a test takes the nodes it needs."""
    lines = ["transport: ssh", "defaults:", "  python: %s" % ssh_hosts.python,
             "  workdir: %s" % workdir,
             "  env:", "    SECRET_TOKEN: ${RDK_TEST_SECRET}", "hosts:"]
    for h in ssh_hosts.hosts[:n]:
        lines.append("  - name: %s" % h.name)
        lines.append("    ssh: %s" % h.name)
        lines.append("    addr: %s" % (addrs or {}).get(h.name, h.addr))
        if pythons and h.name in pythons:
            lines.append("    python: %s" % pythons[h.name])
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def secret(monkeypatch):
    value = "tok-" + secrets.token_hex(12)
    monkeypatch.setenv("RDK_TEST_SECRET", value)
    return value


@pytest.fixture
def user_ssh(ssh_hosts, clean_home):
    """The test hosts as a user would have them: ~/.ssh/config (with IdentityFile and
    UserKnownHostsFile) in the (temporary) home; the agent cache in each host's home."""
    ssh_dir = clean_home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(open(ssh_hosts.ssh_config).read())
    return ssh_hosts


def files_under(folder):
    """Regular files only: a run folder also holds FIFOs (the flight-recorder hook's request
    pipes, agent/torchrun/frhook.py), which a read would wait on forever."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                yield path


def rank_logs(hosts, work, run_id, node) -> dict[str, str]:
    """A node's rank log files: {path on its host: the same file seen from here}."""
    root = hosts[node].root
    return {p[len(root):]: p
            for p in rank_log_files(hosts.local_path(node, work), run_id, node)}


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def ssh_controller(user_ssh, tmp_path, work, n=4):
    """A controller over the first ``n`` SSH hosts and every chunk it receives per file."""
    inv = load_inventory(write_inventory(tmp_path / "hosts.yaml", user_ssh, work, n=n))
    transport = SshTransport(ssh_config=user_ssh.ssh_config, known_hosts=user_ssh.known_hosts,
                             client_keys=[user_ssh.client_key],
                             remote_cache=user_ssh.remote_cache)
    ctl = RunController(inv, transport, History())
    got = defaultdict(list)
    ctl.state.line_listeners.append(
        lambda b: got[(b.node, b.path)].append((b.offset, text_to_bytes(b.text))))
    return ctl, got


async def test_training_over_ssh_every_line_once_and_secrets_kept(user_ssh, tmp_path, secret,
                                                                  host_workdir, project):
    work = host_workdir
    # two nodes: every line once and the secret kept hold per node, with a peer's lines
    # beside; each node more is three torch imports more (preflight, torchrun, worker)
    ctl, got = ssh_controller(user_ssh, tmp_path, work, n=2)
    try:
        await ctl.launch(LaunchSpec(script=SCRIPT, sync=str(project), max_restarts=0,
                                    args=TINY + ["--steps", "30", "--ckpt-every", "10"]),
                         inventory_path=str(tmp_path / "hosts.yaml"))
        assert all(c.ok for c in ctl.preflight_checks)
        await wait_for(lambda: len(ctl.state.ranks) == 2 and all(
            (r.step or 0) >= 2 for r in ctl.state.ranks.values()), TIMEOUT, "first steps")
        # the secret reached every rank, through the protocol channel only
        workers = [p for p in procs.all_pids()
                   if procs.environ(p).get(procs.MARKER, "").startswith(ctl.run_id)
                   and "RANK" in procs.environ(p)]
        assert len(workers) >= 2
        assert all(procs.environ(p).get("SECRET_TOKEN") == secret for p in workers)
        for pid in procs.all_pids():
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    assert secret.encode() not in f.read(), "secret on a command line"
            except OSError:
                pass
        final = await asyncio.wait_for(ctl.wait_done(), TIMEOUT)
        await ctl.stop_store()
        # scrolling back over SSH: rank 0's log read back from its host in small pages
        node0 = ctl.state.ranks[0].node
        fids, since = fids_of(ctl.state, (RANK, 0), node0)
        ctl.page_bytes = 1000
        back, before, pages = [], ctl.state.nodes[node0].journal_offset, 0
        while before > 0:
            recs, before = await ctl.scrollback(node0, fids, before, since)
            back[:0] = recs
            pages += 1
    finally:
        left = await wind_down(ctl)
    assert final == "succeeded", ctl.state.status()
    assert pages > 2
    for fid in fids:
        on_host = user_ssh.local_path(node0, ctl.state.nodes[node0].files[fid].path)
        assert b"".join(text_to_bytes(r[1]) for r in back if r[0]["f"] == fid) == read(on_host)
    seen = 0
    for node in ctl.state.nodes:
        run_dir = user_ssh.local_path(node, "%s/.rankdeck/runs/%s" % (work, ctl.run_id))
        for path in files_under(run_dir):
            seen += 1
            assert secret.encode() not in read(path), "secret written to %s" % path
    assert seen
    for path in files_under(os.environ["XDG_STATE_HOME"]):
        assert secret.encode() not in read(path), "secret in the laptop's history %s" % path
    for node in ctl.state.nodes:
        files = rank_logs(user_ssh, work, ctl.run_id, node)
        assert files
        for path, here in files.items():
            assert b"".join(d for _o, d in sorted(got[(node, path)])) == read(here), path
            offsets = [o for o, _d in got[(node, path)]]
            assert offsets == sorted(set(offsets)), "a chunk arrived twice: %s" % path
    assert left == [], "processes left behind: %s" % left


def console_lines(text: str) -> dict:
    """``[node r] line`` output -> {(node, rank): Counter(lines)} (rank lines only)."""
    out = defaultdict(Counter)
    for line in text.splitlines():
        m = re.match(r"^\[(\S+) r(\d+)\] (.*)$", line)
        if m:
            out[(m.group(1), int(m.group(2)))][m.group(3)] += 1
    return out


def disk_lines(hosts, work, run_id, node) -> Counter:
    lines = Counter()
    for path in rank_logs(hosts, work, run_id, node).values():
        lines.update(read(path).decode("utf-8", "replace").splitlines())
    return lines


def node0_steps(hosts, work, run_id) -> int:
    return len(re.findall(rb"step=", b"".join(
        read(p) for p in rank_logs(hosts, work, run_id, "node0").values())))


def test_console_killed_mid_run_then_attach_delivers_the_rest_once(user_ssh, tmp_path, secret,
                                                                    host_workdir, project):
    work = host_workdir
    inv = write_inventory(tmp_path / "hosts.yaml", user_ssh, work, n=2)
    first = tmp_path / "first.out"
    with open(first, "wb") as out:
        console = start_rankdeck("launch", "--no-tui", "--skip-preflight", "-i", inv,
                                 "--sync", str(project), SCRIPT, "--",
                                 *TINY, "--steps", "60", "--ckpt-every", "20",
                                 stdout=out, stderr=subprocess.STDOUT)
    def stepping() -> bool:
        assert console.poll() is None, first.read_text()
        return len(re.findall(rb"\] step=5 ", first.read_bytes())) >= 2
    try:
        wait_for_sync(stepping, TIMEOUT, lambda: "every rank at step 5:\n" + first.read_text(),
                      every=0.5)
        os.kill(console.pid, signal.SIGKILL)  # the laptop side dies; the training must not
        console.wait()
    finally:
        if console.poll() is None:
            console.kill()
    run_id = re.search(rb"run (\S+) started", first.read_bytes()).group(1).decode()
    # on two nodes the 60 steps may all be done by the time node0's log is first read: the
    # run went on without its console either way (it died at step 5)
    steps_then = node0_steps(user_ssh, work, run_id)
    wait_for_sync(lambda: steps_then >= 60 or node0_steps(user_ssh, work, run_id) > steps_then,
                  60, "training to go on after the console died", every=0.5)

    attach = rankdeck("attach", "--no-tui", run_id, timeout=TIMEOUT)
    (tmp_path / "attach.out").write_text(attach.stdout + "\n--- stderr\n" + attach.stderr)
    assert attach.returncode == 0, attach.stderr
    seen = console_lines(first.read_text() + attach.stdout)
    status = json.loads(rankdeck("status", "--json", run_id).stdout)
    assert status["state"] == "succeeded"
    for node in status["nodes"]:
        (rank,) = [r["rank"] for r in node["ranks"]]
        assert seen[(node["name"], rank)] == disk_lines(user_ssh, work, run_id, node["name"]), \
            node["name"]
    assert processes_of(run_id) == []

    # A teammate's laptop (a state folder of its own) watches the run: it has no record of
    # it, and finds it on the hosts through its inventory (console/run/hosted_record.py)
    teammate = {"XDG_STATE_HOME": str(tmp_path / "laptop2")}
    unknown = rankdeck("watch", "--no-tui", run_id, env=teammate)
    assert unknown.returncode == 2 and "-i INVENTORY" in unknown.stderr, unknown.stderr
    watch = rankdeck("watch", "--no-tui", run_id, "-i", inv, env=teammate, timeout=TIMEOUT)
    (tmp_path / "watch.out").write_text(watch.stdout + "\n--- stderr\n" + watch.stderr)
    assert watch.returncode == 0, watch.stderr
    assert secret not in watch.stdout + watch.stderr
    watched = console_lines(watch.stdout)
    for node in status["nodes"]:
        (rank,) = [r["rank"] for r in node["ranks"]]
        assert watched[(node["name"], rank)] == disk_lines(user_ssh, work, run_id,
                                                           node["name"]), node["name"]
    (copied,) = (tmp_path / "laptop2" / "rankdeck" / "runs").glob(run_id + ".json")
    assert json.loads(copied.read_text())["copied_from"] in user_ssh.names


def test_preflight_catches_torch_mismatch_and_unreachable_rendezvous(user_ssh, tmp_path, secret,
                                                                   host_workdir, project):
    work = host_workdir
    user_ssh.mkdirs(work)  # `rankdeck check` wants the workdir there already
    fake = work + "/faketorch"  # on node2 only: the python in its inventory line (a ~ path)
    user_ssh.put_text("node2", fake + "/torch/__init__.py",
                      "__version__ = '2.0.0-fake'\nclass version:\n    cuda = None\n")
    wrapper = work + "/python-oldtorch"
    user_ssh.put_text("node2", wrapper,
                      "#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s \"$@\"\n"
                      % (user_ssh.expand(fake), user_ssh.python), mode=0o755)
    # node0's addr is a loopback address: it listens there, but only inside its own host
    # three hosts: the rendezvous host, node2 with its old torch, and node1, which only
    # cannot reach the rendezvous (each host more is a torch import in each preflight)
    inv = write_inventory(tmp_path / "hosts.yaml", user_ssh, work,
                          addrs={"node0": "127.0.0.2"}, pythons={"node2": wrapper}, n=3)
    names = user_ssh.names[:3]
    check = rankdeck("check", "--json", "-i", inv, timeout=TIMEOUT)
    assert check.returncode == 1, check.stderr
    rows = {r["name"]: r for r in json.loads(check.stdout)}
    assert rows["node0"]["ok"] and rows["node0"]["rdzv"].startswith("ok")
    assert any("torch 2.0.0-fake differs from torch" in p for p in rows["node2"]["problems"])
    assert sorted(rows) == names, rows
    for name in ("node1", "node2"):
        assert any("cannot reach the rendezvous host node0 (127.0.0.2:" in p
                   for p in rows[name]["problems"]), rows[name]
    launch = rankdeck("launch", "--no-tui", "-i", inv, "--sync", str(project), SCRIPT,
                      timeout=TIMEOUT)
    assert launch.returncode == 1, launch.stderr
    assert "preflight found problems; nothing was started" in launch.stderr
    for node in names:  # the code was sent before the check; nothing ran
        assert os.path.isfile(user_ssh.local_path(node, work + "/" + SCRIPT)), node
        # the run folder holds only the node's action log, with the sync (agent/host/actions.py):
        # no state, journal or torchrun log
        runs = user_ssh.local_path(node, work + "/.rankdeck/runs")
        kept = [os.path.relpath(os.path.join(d, f), runs)
                for d, _dirs, files in os.walk(runs) for f in files]
        assert [os.path.basename(k) for k in kept] == ["actions.jsonl"], (node, kept)
        with open(os.path.join(runs, kept[0])) as f:
            assert [json.loads(line)["action"] for line in f] == ["sync"], (node, kept)


async def test_cut_link_is_reported_then_streams_resume_exactly_once(user_ssh, tmp_path, secret,
                                                                    host_workdir, project):
    work = host_workdir
    # node1 cut, node0 (the rendezvous host) its peer: a node more is two torch imports more
    ctl, got = ssh_controller(user_ssh, tmp_path, work, n=2)
    st = ctl.state
    try:
        await ctl.launch(LaunchSpec(script=SCRIPT, sync=str(project), max_restarts=3,
                                    args=TINY + ["--steps", "80", "--ckpt-every", "10",
                                                 "--pg-timeout", "300"]), preflight=False)
        await wait_for(lambda: len(st.ranks) == 2 and all((r.step or 0) >= 3
                                                          for r in st.ranks.values()),
                       TIMEOUT, "first steps")
        user_ssh.link_down("node1")
        cut = time.monotonic()
        try:
            # keepalives every 2 s, 4 missed: unreachable within about 10 s (without them a
            # dead link goes unnoticed for many minutes)
            await wait_for(lambda: st.nodes["node1"].state == "unreachable", 60,
                           "node1 reported unreachable")
            noticed = time.monotonic() - cut
        finally:
            user_ssh.link_up("node1")
        print("link cut noticed after %.1f s" % noticed)
        await wait_for(lambda: ctl.links["node1"].connected.is_set() and
                       st.nodes["node1"].state != "unreachable", 120, "node1 reconnected")
        assert any(e.kind == "reconnected" and e.node == "node1" for e in st.events)
        await asyncio.wait_for(ctl.wait_done(), TIMEOUT)
        await ctl.stop_store()

        def delivered() -> bool:  # every byte of every rank log (a chunk twice: more)
            return all(sum(len(d) for _o, d in got[(node, path)]) >= os.path.getsize(here)
                       for node in st.nodes
                       for path, here in rank_logs(user_ssh, work, ctl.run_id, node).items())
        await wait_for(delivered, 60, "every rank log's bytes received")
    finally:
        left = await wind_down(ctl)
    for node in st.nodes:
        files = rank_logs(user_ssh, work, ctl.run_id, node)
        assert files
        for path, here in files.items():
            chunks = sorted(got[(node, path)])
            offsets = [o for o, _d in chunks]
            assert offsets == sorted(set(offsets)), "a chunk arrived twice: %s" % path
            assert b"".join(d for _o, d in chunks) == read(here), path
    assert left == [], "processes left behind: %s" % left
