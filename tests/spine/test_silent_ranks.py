"""A run where every rank prints nothing (issue 15): its ranks are `running` while their CPU
advances, and `stalled` once no rank's CPU does (agent/rules/rankcpu.py). Real torchrun, gloo,
2 local nodes; the supervisors sample the workers' CPU every second (agent/supervisor/ranksample.py).
The stall is the run's judge's rule (agent/rules/judge.py): an attached console shows the
judge's events, and a detached run with no console gets them in the judge's journal.

Each run is its start-up, then ``BUSY_S`` of work, then ``STALL_S`` of idle CPU. The stall
threshold is short (4.5 s): a busy rank's CPU on a loaded 2-core machine does not stand still
that long (the stall needs no rank's to advance that long). The work keeps its 12 s (8 s for
the detached run, whose `status` is the judge's): with 4 s, `status` from a new shell with
no judge once said both ranks `running` after the console had stalled them (its replay of
the journals had not marked them busy: a question for console/model/ranks.py ``sample``). The detached run is launched as the module starts and runs
beside the first test's (fixture ``detached``)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from agent.rules.rankcpu import stall_text
from console.errors import AgentError
from console.records.history import History
from console.run.link import NodeLink
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport

from tests.cli import UNBUFFERED, rankdeck, start_rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for, wait_for_sync

from .helpers import all_ended, local_inventory, processes_of, wind_down
from .test_judge import judge_events

pytestmark = pytest.mark.e2e
TIMEOUT = 300
SILENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "silent_worker.py")
BUSY_S = "12"  # the ranks' work, before they sleep
# the run's stall threshold, off the samples' grid: the idle time the rule measures is from
# one sample to another (whole seconds, or 2 s when a loaded supervisor skips a tick), so a
# threshold of 4 s was crossed by 0.01 s, and a replay in `status` could see it not crossed
STALL_S = 4.5


async def launch_silent(tmp_path) -> RunController:
    """Two local nodes of one silent rank each, busy BUSY_S then idle; a stall after STALL_S."""
    ctl = RunController(local_inventory(tmp_path / "work", n=2), LocalTransport(), History())
    # as `rankdeck launch` does (console/verbs/launch.py): the run's threshold is this
    # console's too, which the console's own rules read when the hosts have no judge (else
    # they wait the default 60 s; with a judge, its threshold reaches the console anyway)
    ctl.state.stall_min_s = STALL_S
    await ctl.launch(LaunchSpec(script=SILENT, max_restarts=0, grace=3, stall_after=STALL_S,
                                env={"RANKDECK_SAMPLE_S": "1", "BUSY_S": BUSY_S}),
                     preflight=False)
    return ctl


async def test_a_run_that_prints_nothing_runs_then_stalls_when_its_cpu_stops(tmp_path):
    ctl = await launch_silent(tmp_path)
    ranks = ctl.state.ranks
    try:
        await wait_for(lambda: len(ranks) == 2 and all(r.state == "running" for r in ranks.values()),
                       TIMEOUT, "both silent ranks running")
        assert ctl.state.run_state() == "running"
        assert all(r["silent"] and r["cpu_s"] > 0
                   for n in ctl.status()["nodes"] for r in n["ranks"])
        await wait_for(lambda: all(r.state == "stalled" for r in ranks.values()),
                       TIMEOUT, "both ranks stalled once their CPU stopped")
        stalls = [e for e in ctl.state.events if e.kind == "stalled"]
        assert sorted(e.rank for e in stalls) == [0, 1], stalls
        assert all("no rank's CPU" in e.text for e in stalls), stalls
        assert ctl.state.run_state() == "running"  # stalled, never back to `starting`
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left


class Detached:
    """`rankdeck launch --detach` of a silent run, started and left to run: its consoles get
    state folders of their own (the run's record is there, for `status` and `stop`)."""

    def __init__(self, folder):
        self.work = str(folder / "work")
        self.env = dict(UNBUFFERED, XDG_STATE_HOME=str(folder / "state"),
                        XDG_CACHE_HOME=str(folder / "cache"))
        inv = write_inventory(folder, self.work, 2)
        self.proc = start_rankdeck(
            "launch", "--detach", "--skip-preflight", "-i", inv, "--max-restarts", "0",
            "--stall-after", "%g" % STALL_S, "--env", "RANKDECK_SAMPLE_S=1",
            "--env", "BUSY_S=8", SILENT, env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.run_id: str | None = None

    def launched(self) -> str:
        """The run's id once `launch` returned (its failure, with its output, else)."""
        if self.run_id is None:
            out, err = self.proc.communicate(timeout=TIMEOUT)
            assert self.proc.returncode == 0, out + err
            self.run_id = out.strip().splitlines()[-1]
        return self.run_id

    def rankdeck(self, *args: str) -> subprocess.CompletedProcess:
        return rankdeck(*args, env=self.env)

    def stop(self) -> None:
        out = self.rankdeck("stop", self.launched())
        assert out.returncode == 0, out.stdout + out.stderr
        all_ended(self.run_id)


@pytest.fixture(scope="module", autouse=True)
def detached(tmp_path_factory):
    """The detached run of test_a_detached_run_that_prints_nothing_is_stalled_by_its_judge,
    launched as the module starts (autouse): it runs its course beside the first test's run
    (both spend most of it waiting: busy, then idle until the stall), and its test reads and
    stops it. Stopped here if its test did not."""
    run = Detached(tmp_path_factory.mktemp("detached"))
    yield run
    if run.proc.poll() is None or run.proc.returncode == 0:
        run.launched()
        if processes_of(run.run_id):
            run.stop()


def test_a_detached_run_that_prints_nothing_is_stalled_by_its_judge(detached):
    run_id, work = detached.launched(), detached.work
    try:
        def stalls() -> list[dict]:
            return [e for e in judge_events(work, run_id) if e["what"] == "stalled"]
        wait_for_sync(lambda: len(stalls()) == 2, TIMEOUT,
                      lambda: "both ranks stalled by the judge: %s" % stalls(), every=0.5)
        assert sorted(e["rank"] for e in stalls()) == [0, 1], stalls()
        assert all("no rank's CPU has advanced" in e["text"] for e in stalls()), stalls()
        # a new shell
        status = json.loads(detached.rankdeck("status", run_id, "--json").stdout)
        assert [r["state"] for n in status["nodes"] for r in n["ranks"]] == ["stalled"] * 2
    finally:
        detached.stop()


async def test_with_no_judge_the_console_stalls_the_run_by_the_judges_rule(tmp_path, monkeypatch):
    """An agent older than the judge answers ``judge_start`` as an unknown request (agent/serve/
    server.py). The console says once that it judges the run, and applies the judge's own
    rules (agent/rules/judge.py, through console/judgement/local_judge.py): both silent ranks
    stall when their CPU stops, in the judge's words; `status` from a new shell, which
    replays the journals (every record at once) and finds no judge, says the same."""
    follow = NodeLink.request

    async def older_agent(link, op, timeout=120.0, **args):
        if op == "judge_start":
            raise AgentError("unknown request 'judge_start' (agent 0.1)", "usage")
        return await follow(link, op, timeout=timeout, **args)

    monkeypatch.setattr(NodeLink, "request", older_agent)
    ctl = await launch_silent(tmp_path)
    ranks = ctl.state.ranks
    try:
        await wait_for(lambda: len(ranks) == 2 and all(r.state == "running" for r in ranks.values()),
                       TIMEOUT, "both silent ranks running")
        await wait_for(lambda: all(r.state == "stalled" for r in ranks.values()),
                       TIMEOUT, "both ranks stalled by this console once their CPU stopped")
        assert ctl.state.judge is None and not ctl.judge_host()
        said = [e.text for e in ctl.state.events if e.kind == "judge"]
        assert len(said) == 1 and "this console judges the run" in said[0], said
        stalls = [e for e in ctl.state.events if e.kind == "stalled"]
        assert sorted(e.rank for e in stalls) == [0, 1], stalls
        idle = [float(e.text.rsplit(" for ", 1)[1].split()[0]) for e in stalls]
        assert [e.text for e in stalls] == [stall_text(e.rank, i) for e, i in zip(stalls, idle)]
        status = json.loads(rankdeck("status", ctl.run_id, "--json", env=UNBUFFERED).stdout)
        assert [r["state"] for n in status["nodes"] for r in n["ranks"]] == ["stalled"] * 2
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
