"""Two consoles on one hung run show the same verdict, and neither takes its own (issue 25).

Real torchrun and the reference trainer on 2 local nodes, launched with `--detach`; two
`rankdeck attach RUN --no-tui` consoles follow it from before rank 1 stalls. The run's judge
(agent/judge/judge.py) takes the verdict; both consoles print it, the same line. That neither
console took a verdict of its own is proven from the agents' side: every `serve` of the run
(the consoles' included) logs the op of each request it handles (agent/serve/server.py OPS_LOG), and
a console's own verdict can only come from `why` requests to the nodes' `serve`
(console/judgement/why.py) or from asking the judge (`judge`, which the judge would journal as "asked by
a console"). Neither appears, from the consoles nor from a `status` run meanwhile."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from agent.serve.server import OPS_LOG

from tests.cli import UNBUFFERED, rankdeck, start_rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import TINY, TRAINER, all_ended
from .test_judge import judge_events, wait_for_event

pytestmark = pytest.mark.e2e
TIMEOUT = 300
VERDICT = "[rankdeck] stuck-in-python: "


def test_two_consoles_on_a_hung_run_show_the_judges_verdict_and_take_none(tmp_path):
    ops = tmp_path / "serve-ops.log"
    env = dict(UNBUFFERED, **{OPS_LOG: str(ops)})
    workdir = str(tmp_path / "work")
    inv = write_inventory(tmp_path, workdir, 2)
    # --idle-s 1: the ranks step once a second, so the consoles are attached before the hang
    out = rankdeck("launch", "--detach", "--skip-preflight", "-i", inv, "--max-restarts", "0",
                   "--stall-after", "6", "--grace", "3", TRAINER, "--", *TINY, "--steps", "100000",
                   "--ckpt-every", "0", "--pg-timeout", "600", "--idle-s", "1",
                   "--hang-at-step", "6", "--hang-rank", "1", check=True, env=env)
    run_id = out.stdout.strip().splitlines()[-1]
    outputs = [tmp_path / ("console%d.out" % i) for i in (1, 2)]
    consoles = []
    try:
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
        assert not [e for e in judge_events(workdir, run_id) if e["what"] == "stalled"], \
            "rank 1 stalled before both consoles were attached: the test shows nothing"

        first = wait_for_event(workdir, run_id, lambda e: e["what"] == "verdict"
                               and e["verdict"]["kind"] == "stuck-in-python", "a verdict")[0]
        assert [s["rank"] for s in first["verdict"]["suspects"]] == [1], first
        line = VERDICT + first["verdict"]["summary"]
        wait_for_sync(lambda: all(line in text(i).splitlines() for i in (0, 1)), TIMEOUT,
                      lambda: "verdict line %r in both consoles;\n%s" % (line, show()),
                      every=0.5)
        # a third console, `status` from a new shell, shows the same. Meanwhile a console
        # judging for itself would have asked: its stall rule (the run's 6 s) fires on the
        # console's own clock, within a second of the judge's stall (the judge hears of steps
        # through its link, not sooner), and the judge's verdict takes two samples 1 s apart
        status = json.loads(rankdeck("status", run_id, "--json", check=True, env=env).stdout)

        said = [[ln for ln in text(i).splitlines() if ln.startswith(VERDICT)] for i in (0, 1)]
        assert said[0] == said[1], said  # the same verdict line(s), in the same order
        assert all("suspect rank 1 on %s" % first["verdict"]["suspects"][0]["node"] in text(i)
                   for i in (0, 1)), show()

        # no console took a verdict of its own: no `why` to a node's serve, no `judge` asked
        logged = [ln.split(" ", 1) for ln in ops.read_text().splitlines()]
        subscribers = {pid for pid, op in logged if op == "subscribe"}
        assert len(subscribers) >= 4, logged  # each console's 2 serves log (the log works)
        assert [op for _pid, op in logged if op in ("why", "judge")] == [], logged
        reasons = {e["reason"] for e in judge_events(workdir, run_id) if e["what"] == "verdict"}
        assert reasons <= {"a stall began", "the stall goes on"}, reasons
        assert (status["verdict"] or {}).get("summary") == first["verdict"]["summary"], status
    finally:
        for proc in consoles:  # Ctrl-C: each console detaches, the run goes on
            proc.send_signal(signal.SIGINT)
        for proc in consoles:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        rankdeck("stop", run_id, check=True, env=env)
        all_ended(run_id)
