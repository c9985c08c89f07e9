"""README.md's "Use it" section, followed as a new user would, on 4 realistic hosts.

The commands are read from the ```bash block under "## Use it" and the inventory from its
```yaml block; only placeholders change: RUN_ID, a bracketed option dropped or chosen, the
hosts (the test hosts, reached through ~/.ssh/config as the README says), their python, one
process per node (CPU hosts), and a short trainer tail after ``--``. Every command runs as a
subprocess of the installed ``rankdeck`` from a project folder on the laptop that holds
trainer/ and inventory/cluster.yaml; nothing is put on the hosts by the test.

A README command that does not work as written is a failure here: change the README or the
code, not this test. Every command's output is checked for the inventory's secret.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys

import pytest

from agent.host import procs
from agent.host.journal import JournalReader

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import TINY, processes_of  # noqa: E402
from tests.waits import wait_for_sync  # noqa: E402

pytestmark = pytest.mark.e2e
README = os.path.join(REPO, "README.md")
TIMEOUT = 300
# after `--`: the tiny model, checkpoints often (a restarted node resumes from one soon), and
# enough steps to outlast the walk through the README; `stop` ends it
TRAINER_TAIL = TINY + ["--steps", "100000", "--ckpt-every", "10", "--term-grace", "3"]
STEP_LINE = re.compile(r"^\[(node\d) r(\d)\] .*step=", re.M)


def use_it_section(text: str) -> str:
    start = text.index("\n## Use it")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def fenced(section: str, lang: str) -> str:
    """The first ```lang block of ``section``."""
    m = re.search(r"^```%s\n(.*?)^```" % lang, section, re.M | re.S)
    assert m, "README's Use it section has no ```%s block" % lang
    return m.group(1)


def readme_commands(section: str) -> list[str]:
    """The ```bash block's command lines, comments removed."""
    lines = []
    for line in fenced(section, "bash").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            lines.append(line)
    return lines


def command(lines: list[str], verb: str, run_id: str = "", choose=(), having: str = "",
            tail=()) -> list[str]:
    """The README's ``rankdeck <verb>`` line (the one containing ``having``) as argv: RUN_ID
    filled in, a ``[...]`` option kept (brackets removed) when it is in ``choose``, else
    dropped; ``tail`` appended."""
    found = [l for l in lines if l.split()[:2] == ["rankdeck", verb] and having in l]
    assert found, "README has no `rankdeck %s` line%s" % (verb, " with " + having if having
                                                          else "")
    line = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1) if m.group(1) in choose else "",
                  found[0])
    argv = [run_id if word == "RUN_ID" else word for word in shlex.split(line)]
    return argv + list(tail)


def inventory_from_readme(section: str, hosts) -> str:
    """The README's inventory with the test hosts, their python and one process per node."""
    out, in_hosts = [], False
    for line in fenced(section, "yaml").splitlines():
        key = line.strip().split(":", 1)[0]
        if in_hosts and line.strip().startswith("- "):
            continue  # the README's example hosts: replaced by the test hosts below
        if key == "python":
            line = re.sub(r"python:\s*\S+", "python: %s" % hosts.python, line)
        elif key == "slots":
            line = re.sub(r"slots:\s*\d+", "slots: 1", line)  # CPU hosts: one rank each
        out.append(line)
        if key == "hosts":
            in_hosts = True
            out.extend("  - {name: %s, ssh: %s, addr: %s}" % (h.name, h.name, h.addr)
                       for h in hosts.hosts)
    text = "\n".join(out) + "\n"
    assert "workdir: ~/proj" in text and "${WANDB_API_KEY}" in text, text
    return text


def steps(status: dict) -> dict[int, int]:
    return {r["rank"]: r.get("step") or 0 for n in status["nodes"] for r in n["ranks"]}


class JournalSteps:
    """Each node's newest step, read from its journal on its host through ``local_path``:
    what a wait looks at before it asks `status --json`, whose every look is a rankdeck
    process and four SSH logins, each an agent's start (CPU the run's start-up needs)."""

    def __init__(self, hosts, run_id: str):
        self.readers = {n: JournalReader(hosts.local_path(
            n, "~/proj/.rankdeck/runs/%s/%s/journal" % (run_id, n))) for n in hosts.names}
        self.newest = {n: 0 for n in hosts.names}

    def past(self, step: int) -> bool:
        """Every node's journal has a step past ``step``."""
        for name, reader in self.readers.items():
            for meta in reader.read_metas(["metric"], limit=64 << 20):
                if isinstance(meta.get("step"), int):
                    self.newest[name] = max(self.newest[name], meta["step"])
        return min(self.newest.values()) > step


@pytest.fixture
def readme_project(project, ssh_hosts, clean_home):
    """The laptop project folder the README's commands run in: trainer/ (conftest's
    ``project``) and inventory/cluster.yaml; ~/.ssh/config reaches the hosts."""
    ssh_dir = clean_home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(open(ssh_hosts.ssh_config).read())
    section = use_it_section(open(README).read())
    (project / "inventory").mkdir()
    (project / "inventory" / "cluster.yaml").write_text(inventory_from_readme(section,
                                                                              ssh_hosts))
    return project


def test_readme_use_it_on_four_realistic_hosts(ssh_hosts, readme_project, monkeypatch):
    project = readme_project
    secret = "wandb-" + secrets.token_hex(16)
    monkeypatch.setenv("WANDB_API_KEY", secret)
    rankdeck = os.path.join(os.path.dirname(sys.executable), "rankdeck")
    assert os.access(rankdeck, os.X_OK), "the rankdeck command is not installed in the venv"
    lines = readme_commands(use_it_section(open(README).read()))
    outputs: dict[str, str] = {}
    broken: list[str] = []  # README commands that failed where the walk could go on

    def run(argv, name, go_on=False):
        """Run a README command; it must exit 0. ``go_on``: a failure is noted and the walk
        goes on (the test still fails at the end), for a step the rest does not need."""
        assert argv[0] == "rankdeck"
        res = subprocess.run([rankdeck] + argv[1:], cwd=str(project), capture_output=True,
                             text=True, timeout=TIMEOUT)
        outputs[name] = res.stdout + res.stderr
        said = "`%s` exited %d:\n%s" % (" ".join(argv), res.returncode, outputs[name][-3000:])
        if go_on and res.returncode != 0:
            broken.append(said)
        else:
            assert res.returncode == 0, said
        return res

    run_id = ""
    try:
        run(command(lines, "check"), "check", go_on=True)
        launched = run(command(lines, "launch", having="--detach", tail=["--"] + TRAINER_TAIL),
                       "launch")
        run_id = launched.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"[\w.-]+", run_id), launched.stdout

        # the code came through --sync: it is in every host's ~/proj
        for name in ssh_hosts.names:
            assert os.path.isfile(ssh_hosts.local_path(name, "~/proj/trainer/train.py")), name
        assert run_id in run(command(lines, "ls"), "ls").stdout
        text = run(command(lines, "status", run_id), "status").stdout
        assert all(name in text for name in ssh_hosts.names), text
        status: dict = {}

        def stepping_past(step: int) -> bool:
            """`status --json` (kept in ``status``) says every rank is past ``step``."""
            status.clear()
            status.update(json.loads(run(command(lines, "status", run_id, choose=("--json",)),
                                         "status --json").stdout))
            return len(steps(status)) == 4 and min(steps(status).values()) > step

        # past the first checkpoint (step 10): a restart resumes from it (the journals first,
        # then `status --json` says so)
        journals = JournalSteps(ssh_hosts, run_id)
        wait_for_sync(lambda: journals.past(10), TIMEOUT,
                      lambda: "every node's journal past step 10: %s" % journals.newest,
                      every=0.5)
        wait_for_sync(lambda: stepping_past(10), TIMEOUT,
                      lambda: "every rank past step 10: %s" % status, every=1.0)
        assert status["state"] == "running", status
        # the secret reached every rank, from this shell's environment
        workers = [p for p in procs.all_pids()
                   if procs.environ(p).get(procs.MARKER, "").startswith(run_id + "/")
                   and "RANK" in procs.environ(p)]
        assert len(workers) == 4, workers
        assert all(procs.environ(p).get("WANDB_API_KEY") == secret for p in workers)

        logs = run(command(lines, "logs", run_id), "logs").stdout
        said = set(STEP_LINE.findall(logs))  # every node's rank, by its global rank
        assert sorted(n for n, _r in said) == ssh_hosts.names, logs[-2000:]
        assert sorted(int(r) for _n, r in said) == [0, 1, 2, 3], logs[-2000:]

        # attach --no-tui follows the live run; Ctrl-C detaches and the run goes on
        argv = command(lines, "attach", run_id, choose=("--no-tui",))
        assert argv[0] == "rankdeck"
        out_path, err_path = project.parent / "attach.out", project.parent / "attach.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            attach = subprocess.Popen([rankdeck] + argv[1:], cwd=str(project), stdout=out,
                                      stderr=err)

        def followed() -> bool:
            assert attach.poll() is None, err_path.read_text()
            return len(STEP_LINE.findall(out_path.read_text())) >= 8
        try:
            wait_for_sync(followed, TIMEOUT, "attach to print the run's steps", every=0.5)
            attach.send_signal(signal.SIGINT)
            attach.wait(60)
        finally:
            if attach.poll() is None:
                attach.kill()
                attach.wait()
        outputs["attach"] = out_path.read_text() + err_path.read_text()
        assert attach.returncode == 0, outputs["attach"][-3000:]
        assert "the run goes on" in err_path.read_text(), outputs["attach"][-3000:]

        restarted = run(command(lines, "restart", run_id), "restart")
        assert re.search(r"^node2: running \(launch 2\b", restarted.stdout, re.M), \
            outputs["restart"]
        # node2's old workers are gone, so nobody steps until it is back: steps past the
        # newest one seen now are the run carrying on
        before = max(steps(json.loads(run(command(lines, "status", run_id, choose=("--json",)),
                                          "status --json").stdout)).values())

        def carried_on() -> bool:
            past = stepping_past(before + 2)
            assert status["state"] == "running", status
            node2 = [n for n in status["nodes"] if n["name"] == "node2"][0]
            return past and node2["restarts_used"]
        wait_for_sync(lambda: journals.past(before + 2), TIMEOUT,
                      lambda: "every node's journal past step %d: %s" % (before + 2,
                                                                      journals.newest),
                      every=0.5)
        wait_for_sync(carried_on, TIMEOUT,
                      lambda: "every rank past step %d, node2 restarted: %s" % (before + 2,
                                                                                status),
                      every=2.0)
        logs = run(command(lines, "logs", run_id), "logs").stdout
        assert re.search(r"^\[node2 r\d\] resumed step=\d+ from=", logs, re.M), \
            "node2 did not resume from a checkpoint:\n" + logs[-3000:]
        # the agents kept who restarted node2 (the SSH login too), and who launched
        acted = run(command(lines, "actions", run_id), "actions").stdout
        assert re.search(r"node2 +\S+@\S+ \(login %s\) restarted node2: ok$"
                         % re.escape(ssh_hosts.user), acted, re.M), acted
        assert all(" launched %s: ok" % name in acted for name in ssh_hosts.names), acted

        run(command(lines, "stop", run_id), "stop")
        # nothing left on any host: no process of the run, and every node's record stopped
        assert processes_of(run_id) == []
        for name in ssh_hosts.names:
            here = ssh_hosts.processes(name)
            assert any("sshd" in p for p in here), (name, here)  # the look sees the host
            left = [p for p in here if run_id in p or "train.py" in p]
            assert left == [], (name, left)
            state = ssh_hosts.local_path(name, "~/proj/.rankdeck/runs/%s/%s/state.json"
                                         % (run_id, name))
            with open(state) as f:
                assert json.load(f)["state"] == "stopped", (name, state)
        final = json.loads(run(command(lines, "status", run_id, choose=("--json",)),
                               "status --json").stdout)
        assert final["state"] == "stopped", final
    finally:
        if run_id:
            for pid, _cmd in processes_of(run_id):  # never leave a run behind
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for name, text in outputs.items():
        assert secret not in text, "the secret in the output of `rankdeck %s`" % name
    assert not broken, "README commands that do not work as written:\n" + "\n".join(broken)
