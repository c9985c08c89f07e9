"""Real training over real SSH: 4 namespace hosts with OpenSSH, the reference trainer, torchrun.

The hosts share this machine's filesystem and process table (only the network differs), so
the tests can read every host's run folder and /proc directly.
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

from agent import procs
from agent.protocol import text_to_bytes
from console.history import History
from console.run import LaunchSpec, RunController
from console.scrollback import RANK, fids_of
from console.transport.ssh import SshTransport
from inventory.loader import load_inventory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY, TRAINER, processes_of, rank_log_files, wait_for  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT = 300


def write_inventory(path, ssh_hosts, workdir, python=sys.executable, addrs=None, pythons=None):
    lines = ["transport: ssh", "defaults:", "  python: %s" % python, "  workdir: %s" % workdir,
             "  env:", "    SECRET_TOKEN: ${RDK_TEST_SECRET}", "hosts:"]
    for h in ssh_hosts.hosts:
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
def user_ssh(ssh_hosts, clean_home, monkeypatch):
    """The test hosts as a user would have them: ~/.ssh/config (with IdentityFile and
    UserKnownHostsFile) in the (temporary) home; the agent cache kept in the fixture's dir."""
    ssh_dir = clean_home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(open(ssh_hosts.ssh_config).read())
    monkeypatch.setenv("RANKDECK_REMOTE_CACHE", ssh_hosts.remote_cache)
    return ssh_hosts


def rankdeck(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "console"] + list(args), cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO), **kw)


def files_under(folder):
    for root, _dirs, files in os.walk(folder):
        for name in files:
            yield os.path.join(root, name)


def ssh_controller(user_ssh, tmp_path):
    """A controller over the 4 SSH hosts, a workdir, and every chunk it receives per file."""
    work = tmp_path / "work"
    work.mkdir()
    inv = load_inventory(write_inventory(tmp_path / "hosts.yaml", user_ssh, work))
    transport = SshTransport(ssh_config=user_ssh.ssh_config, known_hosts=user_ssh.known_hosts,
                             client_keys=[user_ssh.client_key],
                             remote_cache=user_ssh.remote_cache)
    ctl = RunController(inv, transport, History())
    got = defaultdict(list)
    ctl.state.line_listeners.append(
        lambda b: got[(b.node, b.path)].append((b.offset, text_to_bytes(b.text))))
    return ctl, work, got


async def test_training_over_ssh_every_line_once_and_secrets_kept(user_ssh, tmp_path, secret):
    ctl, work, got = ssh_controller(user_ssh, tmp_path)
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0,
                                    args=TINY + ["--steps", "30", "--ckpt-every", "10"]),
                         inventory_path=str(tmp_path / "hosts.yaml"))
        assert all(c.ok for c in ctl.preflight_checks)
        await wait_for(lambda: len(ctl.state.ranks) == 4 and all(
            (r.step or 0) >= 2 for r in ctl.state.ranks.values()), TIMEOUT, "first steps")
        # the secret reached every rank, through the protocol channel only
        workers = [p for p in procs.all_pids()
                   if procs.environ(p).get(procs.MARKER, "").startswith(ctl.run_id)
                   and "RANK" in procs.environ(p)]
        assert len(workers) >= 4
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
        if ctl.state.run_state() not in ("succeeded", "failed", "stopped"):
            await ctl.stop()
        await ctl.close()
    assert final == "succeeded", ctl.state.status()
    assert pages > 2
    for fid in fids:
        with open(ctl.state.nodes[node0].files[fid].path, "rb") as f:
            assert b"".join(text_to_bytes(r[1]) for r in back if r[0]["f"] == fid) == f.read()
    run_dir = work / ".rankdeck" / "runs" / ctl.run_id
    for path in files_under(run_dir):
        with open(path, "rb") as f:
            assert secret.encode() not in f.read(), "secret written to %s" % path
    for path in files_under(os.environ["XDG_STATE_HOME"]):
        with open(path, "rb") as f:
            assert secret.encode() not in f.read(), "secret in the laptop's history %s" % path
    for node in ctl.state.nodes:
        files = rank_log_files(work, ctl.run_id, node)
        assert files
        for path in files:
            with open(path, "rb") as f:
                on_disk = f.read()
            assert b"".join(d for _o, d in sorted(got[(node, path)])) == on_disk, path
            offsets = [o for o, _d in got[(node, path)]]
            assert offsets == sorted(set(offsets)), "a chunk arrived twice: %s" % path
    assert processes_of(ctl.run_id) == []


def console_lines(text: str) -> dict:
    """``[node r] line`` output -> {(node, rank): Counter(lines)} (rank lines only)."""
    out = defaultdict(Counter)
    for line in text.splitlines():
        m = re.match(r"^\[(\S+) r(\d+)\] (.*)$", line)
        if m:
            out[(m.group(1), int(m.group(2)))][m.group(3)] += 1
    return out


def disk_lines(work, run_id, node) -> Counter:
    lines = Counter()
    for path in rank_log_files(work, run_id, node):
        with open(path, "rb") as f:
            lines.update(f.read().decode("utf-8", "replace").splitlines())
    return lines


def test_console_killed_mid_run_then_attach_delivers_the_rest_once(user_ssh, tmp_path, secret):
    work = tmp_path / "work"
    work.mkdir()
    inv = write_inventory(tmp_path / "hosts.yaml", user_ssh, work)
    first = tmp_path / "first.out"
    with open(first, "wb") as out:
        console = rankdeck("launch", "--no-tui", "--skip-preflight", "-i", inv, TRAINER, "--",
                           *TINY, "--steps", "60", "--ckpt-every", "20",
                           stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + TIMEOUT
        while len(re.findall(rb"\] step=5 ", first.read_bytes())) < 4:
            assert console.poll() is None, first.read_text()
            assert time.time() < deadline, first.read_text()
            time.sleep(0.5)
        os.kill(console.pid, signal.SIGKILL)  # the laptop side dies; the training must not
        console.wait()
    finally:
        if console.poll() is None:
            console.kill()
    run_id = re.search(rb"run (\S+) started", first.read_bytes()).group(1).decode()
    node_dir = work / ".rankdeck" / "runs" / run_id
    steps_then = len(re.findall(rb"step=", b"".join(
        open(p, "rb").read() for n in ("node0",) for p in rank_log_files(work, run_id, n))))
    deadline = time.time() + 60
    while True:
        steps_now = len(re.findall(rb"step=", b"".join(
            open(p, "rb").read() for p in rank_log_files(work, run_id, "node0"))))
        if steps_now > steps_then:
            break
        assert time.time() < deadline, "training stopped when the console died"
        time.sleep(0.5)
    assert node_dir.exists()

    attach = subprocess.run([sys.executable, "-m", "console", "attach", "--no-tui", run_id],
                            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                            capture_output=True, timeout=TIMEOUT)
    (tmp_path / "attach.out").write_bytes(attach.stdout + b"\n--- stderr\n" + attach.stderr)
    assert attach.returncode == 0, attach.stderr.decode()
    seen = console_lines(first.read_text() + attach.stdout.decode())
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "console", "status", "--json", run_id], cwd=REPO,
        env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, timeout=120).stdout)
    assert status["state"] == "succeeded"
    for node in status["nodes"]:
        (rank,) = [r["rank"] for r in node["ranks"]]
        assert seen[(node["name"], rank)] == disk_lines(work, run_id, node["name"]), node["name"]
    assert processes_of(run_id) == []


def test_preflight_catches_torch_mismatch_and_unreachable_rendezvous(user_ssh, tmp_path, secret):
    fake = tmp_path / "faketorch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "__version__ = '2.0.0-fake'\nclass version:\n    cuda = None\n")
    wrapper = tmp_path / "python-oldtorch"
    wrapper.write_text("#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s \"$@\"\n"
                       % (fake, sys.executable))
    wrapper.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    # node0's addr is a loopback address: it listens there, but only inside its own host
    inv = write_inventory(tmp_path / "hosts.yaml", user_ssh, work,
                          addrs={"node0": "127.0.0.2"}, pythons={"node2": str(wrapper)})
    check = subprocess.run([sys.executable, "-m", "console", "check", "--json", "-i", inv],
                           cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                           capture_output=True, text=True, timeout=TIMEOUT)
    assert check.returncode == 1, check.stderr
    rows = {r["name"]: r for r in json.loads(check.stdout)}
    assert rows["node0"]["ok"] and rows["node0"]["rdzv"].startswith("ok")
    assert any("torch 2.0.0-fake differs from torch" in p for p in rows["node2"]["problems"])
    for name in ("node1", "node2", "node3"):
        assert any("cannot reach the rendezvous host node0 (127.0.0.2:" in p
                   for p in rows[name]["problems"]), rows[name]
    launch = subprocess.run([sys.executable, "-m", "console", "launch", "--no-tui", "-i", inv,
                             TRAINER], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert launch.returncode == 1
    assert "preflight found problems; nothing was started" in launch.stderr
    assert not (work / ".rankdeck").exists()


async def test_cut_link_is_reported_then_streams_resume_exactly_once(user_ssh, tmp_path, secret):
    ctl, work, got = ssh_controller(user_ssh, tmp_path)
    st = ctl.state
    try:
        await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=3,
                                    args=TINY + ["--steps", "80", "--ckpt-every", "10",
                                                 "--pg-timeout", "300"]), preflight=False)
        await wait_for(lambda: len(st.ranks) == 4 and all((r.step or 0) >= 3
                                                          for r in st.ranks.values()),
                       TIMEOUT, "first steps")
        user_ssh.link_down("node2")
        cut = time.monotonic()
        try:
            # keepalives every 2 s, 4 missed: unreachable within 10 s (plus slack for load)
            await wait_for(lambda: st.nodes["node2"].state == "unreachable", 30,
                           "node2 reported unreachable")
            noticed = time.monotonic() - cut
        finally:
            user_ssh.link_up("node2")
        print("link cut noticed after %.1f s" % noticed)
        await wait_for(lambda: ctl.links["node2"].connected.is_set() and
                       st.nodes["node2"].state != "unreachable", 120, "node2 reconnected")
        assert any(e.kind == "reconnected" and e.node == "node2" for e in st.events)
        await asyncio.wait_for(ctl.wait_done(), TIMEOUT)
        await ctl.stop_store()
        await asyncio.sleep(1)
    finally:
        if st.run_state() not in ("succeeded", "failed", "stopped"):
            await ctl.stop()
        await ctl.close()
    for node in st.nodes:
        for path in rank_log_files(work, ctl.run_id, node):
            with open(path, "rb") as f:
                on_disk = f.read()
            chunks = sorted(got[(node, path)])
            offsets = [o for o, _d in chunks]
            assert offsets == sorted(set(offsets)), "a chunk arrived twice: %s" % path
            assert b"".join(d for _o, d in chunks) == on_disk, path
    assert processes_of(ctl.run_id) == []
