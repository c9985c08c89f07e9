"""`rankdeck launch --slurm JOB` on a real Slurm: 4 nodes of a held allocation, the reference
trainer under real torchrun, the agent sent to the nodes through srun (they have none), the
console a CLI on the laptop reaching the login host over SSH as a user's does."""

import collections
import csv
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from types import SimpleNamespace

import pytest

from agent.host.journal import JournalReader
from agent.wire.slurm import JUDGE_COMMENT
from tests.cli import rankdeck, start_rankdeck
from tests.e2e.conftest import TRAINER_DIR
from tests.slurm.slurmcluster import SlurmCluster
from tests.spine.helpers import TINY, node_dir, rank_log_files
from tests.waits import wait_for_sync

pytestmark = [pytest.mark.e2e, pytest.mark.root]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240
PREFIX = re.compile(r"^\[(node\d) r(\d+)\] (.*)$")


@pytest.fixture
def login(slurm, clean_home, tmp_path, host_workdir):
    return login_inventory(slurm, clean_home, tmp_path, host_workdir)


def login_inventory(slurm: SlurmCluster, home, tmp_path, host_workdir) -> str:
    """The user's side: ~/.ssh/config reaching the hosts, an inventory naming the login host
    only (its python and the workdir the nodes use)."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(exist_ok=True)
    (ssh_dir / "config").write_text(open(slurm.hosts.ssh_config).read())
    inv = tmp_path / "login.yaml"
    inv.write_text("transport: ssh\nhosts:\n  - name: login\n    ssh: %s\n    addr: %s\n"
                   "    python: %s\n    workdir: %s\n"
                   % (slurm.login, slurm.hosts[slurm.login].addr, slurm.hosts.python,
                      host_workdir))
    return str(inv)


def launch(login: str, job: str, project, steps: int, restarts: int = 0, *extra,
           preflight: bool = True) -> str:
    """`launch --slurm JOB --detach` of the reference trainer; the run id. ``extra``: the
    trainer's arguments; ``preflight`` False: --skip-preflight (it imports torch on every
    node; the held-allocation test keeps it)."""
    return launch_result(login, job, project, steps, restarts, *extra,
                         preflight=preflight).stdout.split()[-1]


def launch_result(login: str, job: str, project, steps: int, restarts: int = 0,
                  *extra, preflight: bool = True) -> subprocess.CompletedProcess:
    """`launch --slurm JOB --detach` of the reference trainer, as it returned."""
    skip = [] if preflight else ["--skip-preflight"]
    return rankdeck("launch", "-i", login, "--slurm", job, "--detach", *skip, "--sync",
                    str(project), "--max-restarts", str(restarts), "trainer/train.py", *TINY,
                    "--steps", str(steps), *extra, check=True)


def status(run_id: str) -> dict:
    return json.loads(rankdeck("status", run_id, "--json").stdout or "{}")


def status_if(run_id: str, ok) -> dict | None:
    """`status --json` of the run if ``ok(it)``, else None: one look a poll (a second look
    right after may say otherwise, and costs a rankdeck process and its logins)."""
    st = status(run_id)
    return st if ok(st) else None


class NodeFiles:
    """A run's files on its nodes, read here through ``local_path``: what a wait looks at
    before it asks `status --json`, whose every look is a rankdeck process, an SSH login and
    an srun of an agent to each node (CPU the run's own start needs)."""

    def __init__(self, slurm: SlurmCluster, workdir: str, run_id: str, nodes: list[str]):
        self.dirs = {n: node_dir(slurm.hosts.local_path(n, workdir), run_id, n) for n in nodes}
        self.readers: dict = {}
        self.newest = {n: 0 for n in nodes}

    def past(self, step: int) -> bool:
        """Every node's journal has a step at or past ``step``."""
        for name, folder in self.dirs.items():
            path = os.path.join(folder, "journal")
            if name not in self.readers and os.path.exists(path):
                self.readers[name] = JournalReader(path)
            for meta in self.readers[name].read_metas(["metric"], limit=64 << 20) \
                    if name in self.readers else ():
                if isinstance(meta.get("step"), int):
                    self.newest[name] = max(self.newest[name], meta["step"])
        return min(self.newest.values()) >= step

    def states(self) -> dict:
        """Each node's state.json (empty while it has none)."""
        out = {}
        for name, folder in self.dirs.items():
            try:
                with open(os.path.join(folder, "state.json")) as f:
                    out[name] = json.load(f)
            except (OSError, ValueError):
                out[name] = {}
        return out

    def ended(self) -> bool:
        """Every node's supervisor recorded its end."""
        return all(st.get("ended") for st in self.states().values())


# Two nodes where a test's property needs a node beside the first (the judge's host), not
# four: each torch import costs ~3 CPU-s, and a node is two (its torchrun and its worker).
# The held-allocation test keeps all four.
PAIR = 2


def stepping(st: dict) -> int:
    """How many ranks have taken 2 steps."""
    return sum(1 for n in st.get("nodes") or () for r in n.get("ranks") or ()
               if (r.get("step") or 0) >= 2)


def run_left_on_nodes(slurm: SlurmCluster, nodes: list[str] | None = None) -> dict:
    """The login user's processes in each compute node's namespaces (the run's agent,
    supervisors, torchrun and workers would be among them); ``nodes``: of these nodes only
    (a run's job's, while another run trains on the others)."""
    uid = slurm.hosts.run_on(slurm.nodes[0], ["id", "-u"], text=True).stdout.strip()
    left = {}
    for node in nodes or slurm.nodes:
        pids = subprocess.run(["ip", "netns", "pids", slurm.hosts[node].ns],
                              capture_output=True, text=True).stdout.split()
        mine = []
        for pid in pids:
            try:
                if str(os.stat("/proc/%s" % pid).st_uid) == uid:
                    with open("/proc/%s/cmdline" % pid, "rb") as f:
                        mine.append(f.read().replace(b"\0", b" ").decode()[:120])
            except OSError:
                pass
        if mine:
            left[node] = mine
    return left


def test_launch_in_a_held_allocation_trains_every_line_once_and_stop_leaves_nothing(
        slurm, login, project, host_workdir, tmp_path):
    job = slurm.hold()
    try:
        run_id = launch(login, job, project, steps=20)
        files = NodeFiles(slurm, host_workdir, run_id, slurm.nodes)
        wait_for_sync(files.ended, TIMEOUT, lambda: "every node's end: %s" % files.states(),
                      every=0.5)  # (the files first, then `status` says it)
        final = wait_for_sync(lambda: status_if(run_id, lambda st: st.get("state") in (
            "succeeded", "failed", "stopped")), TIMEOUT, lambda: "the run's end: %s"
            % status(run_id))
        assert final["state"] == "succeeded", final
        assert sorted(n["name"] for n in final["nodes"]) == slurm.nodes
        # every line each rank wrote on its node, shown once by `logs`
        shown = collections.Counter()
        for line in rankdeck("logs", run_id, check=True).stdout.splitlines():
            m = PREFIX.match(line)
            if m:
                shown[(m.group(1), m.group(3))] += 1
        written = collections.Counter()
        for node in slurm.nodes:
            for path in rank_log_files(slurm.hosts.local_path(node, host_workdir), run_id,
                                       node):
                with open(path, errors="replace") as f:
                    written.update((node, line) for line in f.read().splitlines())
        assert written and sum(written.values()) >= 4 * 20
        assert {k: shown[k] for k in written} == dict(written)
        # the other verbs of a recorded run work on a Slurm run (through the login host)
        attach = rankdeck("attach", "--no-tui", run_id, check=True)
        assert "succeeded" in attach.stdout + attach.stderr, attach.stdout[-2000:]
        out = tmp_path / "out"
        exported = rankdeck("export", run_id, "--format", "csv", "--out", str(out), check=True)
        (ranks_csv,) = [p for p in exported.stdout.split() if p.endswith("-ranks.csv")]
        with open(ranks_csv, newline="") as f:
            rows = list(csv.DictReader(f))
        assert {row["rank"] for row in rows} == {"0", "1", "2", "3"}, rows[:5]
        assert len(rows) >= 4 * 10, len(rows)  # a row per rank per logged step
        report = rankdeck("report", run_id, "--out", str(out), check=True)
        (page,) = [p for p in report.stdout.split() if p.endswith(".md")]
        assert run_id in open(page).read()
        stop = rankdeck("stop", run_id, check=True)
        assert "Slurm job %s: no step of rankdeck left" % job in stop.stdout
        wait_for_sync(lambda: not run_left_on_nodes(slurm) and not slurm.steps(job), 60,
                      lambda: "nothing of the run left: %s, steps %s"
                      % (run_left_on_nodes(slurm), slurm.steps(job)))
        assert slurm.job_state(job) == "RUNNING"  # the allocation is the user's, not ours
    finally:
        slurm.cmd(["scancel", job], check=False)


def shared_user(slurm: SlurmCluster, tmp_path_factory, name: str) -> SimpleNamespace:
    """A user's side for runs that outlive a test (a module's fixture): its own HOME (the
    SSH config), state and cache folders (``env``: where `launch` records the run, so each
    test's `status` finds it), ``project``, host ``workdir`` and ``login`` inventory."""
    base = tmp_path_factory.mktemp(name)
    (base / "home").mkdir()
    env = {"HOME": str(base / "home"), "XDG_STATE_HOME": str(base / "state"),
           "XDG_CACHE_HOME": str(base / "cache")}
    project = base / "project"
    shutil.copytree(TRAINER_DIR, str(project / "trainer"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    workdir = "~/proj-%s-%s" % (name, secrets.token_hex(3))
    return SimpleNamespace(env=env, project=project, workdir=workdir,
                           login=login_inventory(slurm, base / "home", base, workdir))


def as_user(monkeypatch, user: SimpleNamespace) -> None:
    """This test's consoles as ``user``'s: tests/conftest.py and the e2e conftest gave the
    test folders of its own, which know nothing of the shared runs."""
    for var, value in user.env.items():
        monkeypatch.setenv(var, value)


@pytest.fixture(scope="module")
def pair_runs(slurm, tmp_path_factory):
    """Two runs of PAIR nodes launched one after the other, each in a job of its own
    (exclusive: no node in both), so the second starts while the first's test reads its own:
    ``cancelled`` (the scancel test's) and ``restarted`` (the restart test's: restarts
    allowed, a checkpoint every 10 steps). Each test ends its own run and cancels its job
    (the next tests hold every node); what is left is cancelled at the module's end."""
    jobs: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        user = shared_user(slurm, tmp_path_factory, "pair")
        for var, value in user.env.items():
            mp.setenv(var, value)
        mp.delenv("SSH_AUTH_SOCK", raising=False)
        try:
            runs = {}
            # --idle-s 0.1 (time on a GPU, the CPU idle): the restarted run trains while the
            # scancel test runs, and only its restart is looked at
            for name, steps, extra in (
                    ("cancelled", 5000, ()),
                    ("restarted", 100000, (3, "--ckpt-every", "10", "--pg-timeout", "300",
                                           "--idle-s", "0.1"))):
                job = slurm.hold(PAIR, exclusive=True)
                jobs.append(job)
                runs[name] = SimpleNamespace(
                    job=job, nodes=slurm.nodes_of(job),
                    run_id=launch(user.login, job, user.project, steps, *extra,
                                  preflight=False))
            yield SimpleNamespace(user=user, **runs)
        finally:
            slurm.cmd(["scancel"] + jobs, check=False)


def test_scancel_from_outside_ends_the_run_cancelled_with_the_reason_and_nothing_left(
        slurm, pair_runs, monkeypatch):
    as_user(monkeypatch, pair_runs.user)
    run, workdir = pair_runs.cancelled, pair_runs.user.workdir
    job, nodes, run_id = run.job, run.nodes, run.run_id  # the judge's node and another
    files = NodeFiles(slurm, workdir, run_id, nodes)
    try:
        wait_for_sync(lambda: files.past(2), TIMEOUT, lambda: "every node's journal past "
                      "step 2: %s" % files.newest, every=0.5)  # (the files first)
        wait_for_sync(lambda: stepping(status(run_id)) == PAIR, TIMEOUT,
                      lambda: "every rank stepping: %s" % status(run_id))
        # a live Slurm run's stacks and verdict, through the login host's srun
        stacks = rankdeck("stacks", run_id, check=True)
        heads = re.findall(r"^\[(node\d) r(\d+)\] pid \d+", stacks.stdout, re.M)
        assert sorted({n for n, _r in heads}) == nodes and \
            sorted(int(r) for _n, r in heads) == list(range(PAIR)), stacks.stdout[-2000:]
        verdict = json.loads(rankdeck("why", run_id, "--json", check=True).stdout)
        assert verdict["kind"] not in ("unreachable", "stuck-in-python", "mismatch"), verdict
        slurm.cmd(["scancel", job])  # an administrator, or the user from another shell
        # each node's supervisor sees its job end and ends what left the job's steps; what
        # each recorded and said is read as it ends, what is left of the run after (the
        # run's store outlives its nodes by its settle time: agent/store/tcpstore.py)
        wait_for_sync(files.ended, 90, lambda: "every node's end: %s" % files.states())
        assert len(nodes) == PAIR
        for node, state in files.states().items():
            assert state["state"] == "stopped" and "cancelled" in state["cause"]["message"]
        final = wait_for_sync(lambda: status_if(run_id, lambda st: st.get("state") == "cancelled"),
                              60, lambda: "status says cancelled: %s" % status(run_id))
        # (COMPLETING first, while Slurm cleans up)
        assert "Slurm job %s was cancelled" % job in final["slurm"]["ended"]
        # the run's judge on the first node says so too (a detached run's --notify)
        journal = os.path.join(os.path.dirname(files.dirs[nodes[0]]), "judge", "journal")
        ended = wait_for_sync(lambda: [m for m, _d, _e in JournalReader(journal).read()
                                       if m.get("what") == "run_ended"], 30, "the judge's end")
        assert ended[0]["state"] == "cancelled" and "was cancelled" in ended[0]["text"], ended
        # nothing of the run is left on the job's nodes (the other run trains on beside it)
        wait_for_sync(lambda: not run_left_on_nodes(slurm, nodes), 90,
                      lambda: "nothing of the run left: %s" % run_left_on_nodes(slurm, nodes))
        for node, state in files.states().items():  # (as each supervisor left it)
            assert state["state"] == "stopped" and "cancelled" in state["cause"]["message"]
        assert not slurm.steps(job)
    finally:
        slurm.cmd(["scancel", job], check=False)


def steps_of(st: dict) -> dict:
    """{rank: step} of every rank that has stepped."""
    return {r["rank"]: r.get("step") or 0 for n in st.get("nodes") or () for r in n["ranks"]}


def test_restart_of_one_node_inside_the_job_rejoins_and_training_goes_on(
        slurm, pair_runs, monkeypatch):
    as_user(monkeypatch, pair_runs.user)
    run = pair_runs.restarted  # the restarted node rejoins a peer that trained on: two will do
    job, run_id = run.job, run.run_id
    drained = None
    try:
        # the second node restarts (the first holds the judge); the first is drained
        drained, restarted = run.nodes
        files = NodeFiles(slurm, pair_runs.user.workdir, run_id, run.nodes)
        wait_for_sync(lambda: files.past(12), TIMEOUT, lambda: "every node's journal past "
                      "step 12: %s" % files.newest, every=0.5)  # (the files first)
        wait_for_sync(lambda: status_if(run_id, lambda st: len(steps_of(st)) == PAIR
                                        and min(steps_of(st).values()) >= 12), TIMEOUT,
            lambda: "every rank past its first checkpoint: %s" % status(run_id))
        rankdeck("restart", run_id, "--node", restarted, check=True)
        before = max(steps_of(status(run_id)).values())
        wait_for_sync(lambda: files.states()[restarted].get("restarts", 0) >= 1
                      and files.states()[restarted].get("state") == "running", TIMEOUT,
                      lambda: "%s restarted: %s" % (restarted, files.states()[restarted]),
                      every=0.5)  # (its state file first)

        def rejoined():
            st = status(run_id)
            node = [n for n in st["nodes"] if n["name"] == restarted][0]
            return (node["restarts_used"] >= 1 and node["state"] == "running"
                    and len(steps_of(st)) == PAIR and min(steps_of(st).values()) > before)
        wait_for_sync(rejoined, TIMEOUT, lambda: "%s restarted and every rank past step "
                      "%d: %s" % (restarted, before, status(run_id)))
        # an administrator drains a node: status says so in Slurm's words (the job goes on)
        slurm.cmd(["scontrol", "update", "NodeName=" + drained, "State=DRAIN",
                   "Reason=disk-test"])
        node = [n for n in status(run_id)["nodes"] if n["name"] == drained][0]
        assert node["slurm"] == "draining (disk-test)", node
        rankdeck("stop", run_id, check=True)
        wait_for_sync(lambda: not run_left_on_nodes(slurm, run.nodes) and not slurm.steps(job),
                      60, lambda: "nothing of the run left: %s, steps %s"
                      % (run_left_on_nodes(slurm, run.nodes), slurm.steps(job)))
    finally:
        slurm.cmd(["scancel", job], check=False)
        if drained:
            slurm.cmd(["scontrol", "update", "NodeName=" + drained, "State=RESUME"],
                      check=False)


def followers_of(run_id: str) -> list[int]:
    """Pids of the queued run's follower (console/verbs/slurm_follower.py) still running."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"console.verbs.slurm_follower" in argv and run_id.encode() in argv:
            found.append(int(pid))
    return found


QUEUED_VALUE = "queued-env-value-7c1e"  # an --env value of a queued run: never on disk


def gather(stream, into: list) -> threading.Thread:
    """A thread appending ``stream``'s lines to ``into`` until its end."""
    thread = threading.Thread(target=lambda: into.extend(iter(stream.readline, "")),
                              daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def queued(slurm, tmp_path_factory):
    """Two submits of PAIR nodes that wait behind one job holding every node (the blocker),
    both let run by its end: `submit --detach` first (its follower launches the run once the
    job runs), then an attached `submit --no-tui` (its test leaves it with Ctrl-C), each on
    nodes of its own. Read while both waited, before the blocker's end, for the detach test:
    ``res`` (submit's result), ``job``, ``run_id``, ``queued_text`` (its queued file),
    ``followers`` and ``status`` (`status --json`: no other status of it until its follower
    launched it). The attached submit's output gathers in ``out`` and ``err``."""
    from console.slurm.queued import queued_path
    got = SimpleNamespace(job=None, run_id=None, proc=None, out=[], err=[], readers=[])
    blocker = None
    with pytest.MonkeyPatch.context() as mp:
        got.user = user = shared_user(slurm, tmp_path_factory, "queued")
        for var, value in user.env.items():
            mp.setenv(var, value)
        mp.delenv("SSH_AUTH_SOCK", raising=False)
        try:
            blocker = slurm.hold(exclusive=True)  # another job holds every node
            got.res = rankdeck("submit", "-i", user.login, "--nodes", str(PAIR), "--time",
                               "00:04:00", "--detach", "--skip-preflight", "--sync",
                               str(user.project), "--max-restarts", "0", "--env",
                               "RD_QUEUED=" + QUEUED_VALUE, "trainer/train.py", *TINY,
                               "--steps", "10", check=True)
            got.job = re.search(r"submitted Slurm job (\d+)", got.res.stderr).group(1)
            got.run_id = got.res.stdout.split()[-1]
            with open(queued_path(got.run_id)) as f:
                got.queued_text = f.read()
            got.followers = followers_of(got.run_id)
            got.status = status(got.run_id)  # still waiting: said in Slurm's words
            # the attached one queues behind it; both run once the blocker ends
            got.proc = start_rankdeck(
                "submit", "-i", user.login, "--nodes", str(PAIR), "--time", "00:04:00",
                "--no-tui", "--skip-preflight", "--sync", str(user.project),
                "--max-restarts", "0", "trainer/train.py", *TINY, "--steps", "100000",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            got.readers = [gather(got.proc.stdout, got.out), gather(got.proc.stderr, got.err)]
            wait_for_sync(lambda: any("submitted Slurm job" in ln for ln in got.err)
                          or got.proc.poll() is not None, TIMEOUT, "the attached submit's job")
            slurm.cmd(["scancel", blocker])
            yield got
        finally:
            if got.proc is not None and got.proc.poll() is None:
                got.proc.kill()
                got.proc.wait()
            attached = re.findall(r"submitted Slurm job (\d+)", "".join(got.err))
            slurm.cmd(["scancel"] + [j for j in [blocker, got.job] + attached if j],
                      check=False)
            for pid in followers_of(got.run_id) if got.run_id else ():  # (a failed test's)
                os.kill(pid, 9)


def test_submit_detach_returns_while_pending_and_its_follower_launches_once_it_runs(
        slurm, queued, monkeypatch):
    from console.slurm.queued import queued_path
    as_user(monkeypatch, queued.user)
    res, job, run_id = queued.res, queued.job, queued.run_id
    # its --env value is not on disk: the follower got it through its stdin (issue 40)
    assert QUEUED_VALUE not in queued.queued_text
    assert "Slurm job %s PENDING: waiting for free nodes (Resources)" % job in res.stderr
    assert "a follower on this machine" in res.stderr and queued.followers, res.stderr
    st = queued.status  # still waiting: said in Slurm's words
    assert st["state"] == "queued" and st["slurm"]["reason"] == "Resources", st
    # the nodes free up (the fixture cancelled the blocker): the follower launches the run,
    # nobody asking (no status: that would launch it too); then it ends
    log = queued_path(run_id, ".log")
    wait_for_sync(lambda: not os.path.exists(queued_path(run_id))
                  and not followers_of(run_id), TIMEOUT,
                  lambda: "the follower's launch: %s" % open(log).read()[-2000:])
    nodelist = slurm.cmd(["squeue", "-h", "--states=all", "-j", job, "-o", "%N"]).strip()
    files = NodeFiles(slurm, queued.user.workdir, run_id,
                      slurm.cmd(["scontrol", "show", "hostnames", nodelist]).split())
    wait_for_sync(files.ended, TIMEOUT, lambda: "every node's end: %s" % files.states(),
                  every=0.5)  # (the files first, then `status` says it)
    final = wait_for_sync(lambda: status_if(run_id, lambda st: st.get("state") in (
        "succeeded", "failed")), TIMEOUT, lambda: "the run's end: %s" % status(run_id))
    assert final["state"] == "succeeded" and final["slurm"]["job"] == job, final
    assert "launched" in open(log).read()
    # nobody attached: the run's judge ends the job it ran in, not its time limit, and
    # its end state says how the run ended
    wait_for_sync(lambda: slurm.job_state(job) in ("", "COMPLETED"), 60,
                  lambda: "job %s ended by the judge: %s" % (job, slurm.job_state(job)))
    after = rankdeck("status", run_id, "--json")
    assert after.returncode == 0, after.stderr
    ended = json.loads(after.stdout)
    assert ended["state"] == "succeeded" and "COMPLETED: the run's judge ended it" in \
        ended["slurm"]["ended"], ended  # (its comment says so: Slurm's own record too)
    assert JUDGE_COMMENT in slurm.cmd(["squeue", "-h", "--states=all", "-j", job, "-o",
                                       "%k"]), "the job's comment"
    stop = rankdeck("stop", run_id, check=True)
    assert "Slurm job %s is over (COMPLETED)" % job in stop.stdout, stop.stdout


def test_leaving_an_attached_submit_leaves_the_run_and_its_job_running(
        slurm, queued, monkeypatch):
    """`submit` without --detach, then Ctrl-C (the view's `q` leaves the same way): the run
    the user detached from trains on in its job; `stop` cancels the job."""
    as_user(monkeypatch, queued.user)
    proc = queued.proc

    def stepped():  # the ranks' lines: the run is up
        assert proc.poll() is None, "submit ended before its ranks stepped: %s" % (
            queued.out[-20:] + queued.err[-20:])
        return sum("step=" in ln for ln in queued.out) >= 8
    wait_for_sync(stepped, TIMEOUT, lambda: "8 lines of steps: %s" % queued.out[-20:],
                  every=0.2)
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    for reader in queued.readers:
        reader.join(10)
    err = "".join(queued.err)
    job = re.search(r"submitted Slurm job (\d+)", err).group(1)
    run_id = re.search(r"rankdeck attach ([^\s`]+)", err).group(1)
    assert "cancelled" not in err and "holds the run on" in err, err
    assert slurm.job_state(job) == "RUNNING"
    before = max(steps_of(status(run_id)).values())
    wait_for_sync(lambda: min(steps_of(status(run_id)).values()) > before, TIMEOUT,
                  lambda: "the run goes on past step %d: %s" % (before, status(run_id)))
    stop = rankdeck("stop", run_id, check=True)
    assert "Slurm job %s cancelled (rankdeck submitted it)" % job in stop.stdout
