"""Consoles on one hung run: real torchrun and the reference trainer on 2 local nodes, rank 1
hung in Python at step 6, launched by `rankdeck launch --no-tui` (the first console) and
followed by two `rankdeck attach RUN --no-tui` consoles from before rank 1 stalls. One run
(the module's fixture, ``hung``) serves both tests here, which only read what it recorded.

`launch --no-tui` prints who is stuck when the ranks stall: the verdict lines name rank 1,
its node, its line and the source line the host read.

Two consoles on one hung run show the same verdict, and neither takes its own (issue 25). The
run's judge (agent/judge/judge.py) takes the verdict; both attached consoles print it, the same
line. That no console took a verdict of its own is proven from the agents' side: every `serve`
of the run (every console's, the launching one's included) logs the op of each request it
handles (agent/serve/server.py OPS_LOG), and a console's own verdict can only come from `why`
requests to the nodes' `serve` (console/judgement/why.py) or from asking the judge (`judge`,
which the judge would journal as "asked by a console"). Neither appears, from the consoles nor
from a `status` run meanwhile."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from types import SimpleNamespace

import pytest

from agent.serve.server import OPS_LOG

from tests.cli import UNBUFFERED, rankdeck, start_rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import TINY, TRAINER, all_ended, processes_of
from .test_judge import judge_events, wait_for_event
from .test_stuck import line_of

pytestmark = pytest.mark.e2e
TIMEOUT = 300
VERDICT = "[rankdeck] stuck-in-python: "


def read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


def lines_until(lines: queue.Queue, seen: list[str], done, timeout: float) -> None:
    """Takes what rankdeck printed into ``seen`` until ``done(seen)``; fails if it ended."""
    def printed() -> bool:
        while not done(seen):
            try:
                line = lines.get_nowait()
            except queue.Empty:
                return False
            assert line is not None, "rankdeck ended first:\n" + "\n".join(seen[-40:])
            seen.append(line)
        return True
    wait_for_sync(printed, timeout, lambda: "the line awaited; rankdeck printed:\n"
                  + "\n".join(seen[-40:]))


def _detach(procs: list[subprocess.Popen]) -> None:
    for proc in procs:  # Ctrl-C: each console detaches, the run goes on
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """The hung run, watched by the three consoles until every one has shown the judge's
    verdict, then detached from and stopped. What the tests read, in the order it happened:
    ``seen`` (what `launch --no-tui` printed up to the verdict's source line), the judge's
    ``stalled_early`` events (any is a stall before both attached consoles printed a line of
    rank 1's), its ``first`` verdict event, ``status`` (`status --json` from a new shell after
    both attached consoles printed the verdict), then at once ``texts`` (each attached
    console's output), ``ops`` (every serve's requests) and ``events`` (the judge's); after
    the stop, ``left`` (the run's processes still alive once `rankdeck stop` returned)."""
    tmp = tmp_path_factory.mktemp("hung")
    ops = tmp / "serve-ops.log"
    # the fixture outlives a test's own state folders (tests/conftest.py): every console
    # here gets the fixture's, so `status` finds the run `launch` recorded
    env = dict(UNBUFFERED, **{OPS_LOG: str(ops), "XDG_STATE_HOME": str(tmp / "state"),
                              "XDG_CACHE_HOME": str(tmp / "cache")})
    workdir = str(tmp / "work")
    inv = write_inventory(tmp, workdir, 2)
    # --idle-s 1: the ranks step once a second, so the consoles are attached before the hang;
    # no preflight: it imports torch once per node and these consoles are not about it
    launcher = start_rankdeck(
        "launch", "--no-tui", "--skip-preflight", "-i", inv, "--max-restarts", "0",
        "--stall-after", "6", "--grace", "3", TRAINER,
        "--", *TINY, "--steps", "100000", "--ckpt-every", "0", "--pg-timeout", "600",
        "--idle-s", "1", "--hang-at-step", "6", "--hang-rank", "1",
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=read_lines, args=(launcher.stdout, lines), daemon=True).start()
    got = SimpleNamespace(seen=[], workdir=workdir)
    outputs = [tmp / ("console%d.out" % i) for i in (1, 2)]
    consoles: list[subprocess.Popen] = []
    run_id = None
    try:
        lines_until(lines, got.seen, lambda s: any(" started on 2 nodes" in x for x in s),
                    TIMEOUT)
        run_id = got.run_id = next(x for x in got.seen if " started on 2 nodes" in x).split()[2]
        for path in outputs:
            with open(path, "w") as f:
                consoles.append(start_rankdeck("attach", run_id, "--no-tui", env=env,
                                               stdout=f, stderr=subprocess.STDOUT))

        def text(i: int) -> str:
            return outputs[i].read_text(errors="replace")

        def show() -> str:
            return "\n".join("console %d:\n%s" % (i + 1, text(i)[-3000:]) for i in (0, 1))

        # both follow the run live, before rank 1 stalls
        wait_for_sync(lambda: all(" r1] " in text(i) for i in (0, 1)), TIMEOUT,
                      lambda: "a rank 1 line in both consoles;\n" + show(), every=0.5)
        got.stalled_early = [e for e in judge_events(workdir, run_id) if e["what"] == "stalled"]
        got.first = wait_for_event(workdir, run_id, lambda e: e["what"] == "verdict"
                                   and e["verdict"]["kind"] == "stuck-in-python",
                                   "a verdict")[0]
        line = VERDICT + got.first["verdict"]["summary"]
        wait_for_sync(lambda: all(line in text(i).splitlines() for i in (0, 1)), TIMEOUT,
                      lambda: "verdict line %r in both consoles;\n%s" % (line, show()),
                      every=0.5)
        # a fourth console, `status` from a new shell, shows the same. Meanwhile a console
        # judging for itself would have asked: its stall rule (the run's 6 s) fires on the
        # console's own clock, within a second of the judge's stall (the judge hears of steps
        # through its link, not sooner), and the judge's verdict takes two samples 1 s apart
        got.status = json.loads(rankdeck("status", run_id, "--json", check=True,
                                         env=env).stdout)
        got.texts = [text(i) for i in (0, 1)]
        got.ops = ops.read_text().splitlines()
        got.events = judge_events(workdir, run_id)
        lines_until(lines, got.seen, lambda s: any("> time.sleep(3600)" in x for x in s),
                    TIMEOUT)
    finally:
        _detach(consoles + [launcher])  # the launching console detaches too
        if run_id:
            rankdeck("stop", run_id, env=env)
            got.left = processes_of(run_id)
            for pid, _cmd in got.left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            all_ended(run_id)
    yield got


def test_no_tui_prints_the_verdict_naming_the_hung_rank_and_its_line(hung):
    seen = hung.seen
    verdict = [x for x in seen if x.startswith("[rankdeck] stuck-in-python:")]
    assert len(verdict) == 1, seen[-40:]
    i = seen.index(verdict[0])
    line = line_of("time.sleep(3600)")
    assert "never entered by rank 1 on node" in verdict[0], verdict
    node = verdict[0].split("never entered by rank 1 on ")[1].split()[0]
    assert seen[i + 1].startswith("[rankdeck]   suspect rank 1 on %s at " % node), seen[i + 1]
    assert seen[i + 1].endswith("trainer/faults.py:%d in injected_hang" % line), seen[i + 1]
    assert seen[i + 2] == "[rankdeck]     > time.sleep(3600)", seen[i + 2]
    # the node named is where rank 1 ran: its own line says so
    assert any(x.startswith("[%s r1] " % node) for x in seen), "rank 1 printed on another node"
    assert hung.left == [], hung.left


def test_two_consoles_on_a_hung_run_show_the_judges_verdict_and_take_none(hung):
    assert not hung.stalled_early, \
        "rank 1 stalled before both consoles were attached: the test shows nothing"
    first, texts = hung.first, hung.texts
    assert [s["rank"] for s in first["verdict"]["suspects"]] == [1], first
    said = [[ln for ln in texts[i].splitlines() if ln.startswith(VERDICT)] for i in (0, 1)]
    assert said[0] == said[1], said  # the same verdict line(s), in the same order
    assert all("suspect rank 1 on %s" % first["verdict"]["suspects"][0]["node"] in texts[i]
               for i in (0, 1)), texts

    # no console took a verdict of its own: no `why` to a node's serve, no `judge` asked
    logged = [ln.split(" ", 1) for ln in hung.ops]
    subscribers = {pid for pid, op in logged if op == "subscribe"}
    assert len(subscribers) >= 4, logged  # each console's 2 serves log (the log works)
    assert [op for _pid, op in logged if op in ("why", "judge")] == [], logged
    reasons = {e["reason"] for e in hung.events if e["what"] == "verdict"}
    assert reasons <= {"a stall began", "the stall goes on"}, reasons
    assert (hung.status["verdict"] or {}).get("summary") == first["verdict"]["summary"], \
        hung.status
