"""The run watches itself: real torchrun and the reference trainer on 2 local nodes (each node
more costs its torchrun's and its worker's start-up, the tests' time), launched with
`--detach` and then left with no console anywhere. The judge on the rendezvous host
(agent/judge/judge.py) takes the verdict when rank 1 hangs, restarts the node it names with
`--on-hang restart`, ends a run whose rank aborted after its last step, and runs `--notify`;
`status --json` from a new shell shows what it decided."""

from __future__ import annotations

import json
import os

import pytest

from agent.host.journal import JournalReader
from agent.host.runfiles import read_json

from tests.cli import UNBUFFERED, rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import TINY, TRAINER, all_ended
from .test_stuck import line_of

pytestmark = pytest.mark.e2e
TIMEOUT = 300


def launch_detached(tmp_path, trainer_args: list[str], *options: str,
                    nodes: int = 4) -> tuple[str, str]:
    workdir = str(tmp_path / "work")
    inv = write_inventory(tmp_path, workdir, nodes)
    # no preflight: it imports torch once per node (half a minute on a loaded 2-core box) and
    # these runs test the judge; `check` has its own tests (tests/spine/test_field_console.py)
    out = rankdeck("launch", "--detach", "--skip-preflight", "-i", inv, *options, TRAINER, "--",
                   *TINY, *trainer_args, env=UNBUFFERED)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().splitlines()[-1], workdir


def judge_events(workdir: str, run_id: str) -> list[dict]:
    path = os.path.join(workdir, ".rankdeck", "runs", run_id, "judge", "journal")
    return [m for m, _d, _e in JournalReader(path).read(limit=64 << 20) if m.get("k") == "event"]


def wait_for_event(workdir, run_id, pick, what, timeout=TIMEOUT) -> list[dict]:
    """The judge's events that ``pick`` takes, once there is one."""
    return wait_for_sync(lambda: [e for e in judge_events(workdir, run_id) if pick(e)], timeout,
                         lambda: "%s in the judge's journal; it holds:\n%s" % (what, "\n".join(
                             str(e.get("text")) for e in judge_events(workdir, run_id))),
                         every=0.5)


def stop(run_id: str) -> None:
    out = rankdeck("stop", run_id, env=UNBUFFERED)
    assert out.returncode == 0, out.stdout + out.stderr
    all_ended(run_id)


def test_a_detached_run_gets_its_verdict_with_no_console_and_status_shows_it(tmp_path):
    notified = tmp_path / "notified.jsonl"
    # 2 nodes: rank 1 hangs, rank 0 waits for it (each node more is ~14 CPU-s of start-up)
    run_id, workdir = launch_detached(
        tmp_path, ["--steps", "100000", "--ckpt-every", "0", "--pg-timeout", "600",
                   "--hang-at-step", "6", "--hang-rank", "1"],
        # --grace 3: a hung rank ignores SIGTERM; the stop kills it after 3 s, not 10
        "--max-restarts", "0", "--stall-after", "6", "--grace", "3",
        "--notify", "cat >> %s" % notified, nodes=2)
    stopped = False
    try:
        started = wait_for_event(workdir, run_id, lambda e: e["what"] == "judge", "judge start")
        assert started[0]["stall_after"] == 6  # the run's own setting, not a console's
        stalled = wait_for_event(workdir, run_id, lambda e: e["what"] == "stalled", "a stall")
        verdict = wait_for_event(workdir, run_id, lambda e: e["what"] == "verdict"
                                 and e["verdict"]["kind"] == "stuck-in-python", "a verdict")
        # how long after the stall the verdict came (recorded in the note, not asserted)
        print("verdict %.1f s after the stall" % (verdict[0]["ts"] - stalled[0]["ts"]))
        suspects = verdict[0]["verdict"]["suspects"]
        assert [s["rank"] for s in suspects] == [1], verdict
        assert suspects[0]["frame"].endswith("trainer/faults.py:%d in injected_hang"
                                             % line_of("time.sleep(3600)")), suspects
        assert suspects[0]["source"] == "time.sleep(3600)"
        out = rankdeck("status", run_id, "--json", env=UNBUFFERED)
        status = json.loads(out.stdout)
        assert status["verdict"]["kind"] == "stuck-in-python", status["verdict"]
        assert [s["rank"] for s in status["verdict"]["suspects"]] == [1]
        assert status["verdict"]["suspects"][0]["node"] == suspects[0]["node"]
        ranks = {r["rank"]: r for n in status["nodes"] for r in n["ranks"]}
        assert ranks[1]["state"] == "stalled", ranks[1]
        # `why` from a new shell asks the judge for a fresh verdict (not notified: asked)
        why = rankdeck("why", run_id, "--json", env=UNBUFFERED)
        assert why.returncode == 0, why.stdout + why.stderr
        assert [s["rank"] for s in json.loads(why.stdout)["suspects"]] == [1], why.stdout
        assert any(e["what"] == "verdict" and e.get("reason") == "asked by a console"
                   for e in judge_events(workdir, run_id))
        stop(run_id)
        stopped = True
        # the stall (once, not once per rank), the verdict and the end, each once
        kinds = [json.loads(line)["kind"] for line in notified.read_text().splitlines()]
        assert kinds == ["stall", "verdict", "stopped"], kinds
    finally:
        if not stopped:
            stop(run_id)


def test_on_hang_restart_restarts_the_named_node_and_every_rank_steps_again(tmp_path):
    run_id, workdir = launch_detached(
        tmp_path, ["--steps", "100000", "--ckpt-every", "3", "--pg-timeout", "600",
                   "--hang-at-step", "8", "--hang-rank", "1"],
        # --grace 3: the hung node's restart kills its rank after 3 s, not 10
        "--max-restarts", "3", "--stall-after", "6", "--grace", "3", "--on-hang", "restart",
        nodes=2)  # rank 1 hangs; its node is restarted, the other waits for it
    try:
        verdict = wait_for_event(workdir, run_id, lambda e: e["what"] == "verdict"
                                 and e["verdict"]["suspects"], "a verdict naming a rank")
        node = verdict[0]["verdict"]["suspects"][0]["node"]
        restarted = wait_for_event(workdir, run_id, lambda e: e["what"] == "restarted",
                                   "the judge's restart")
        assert restarted[0]["node"] == node and restarted[0]["reason"] == "on-hang"
        # the restart went through the node operation serve runs (one door): it answered once
        # the old torchrun was gone, with it, and the judge had it taken out of the rendezvous
        # (its link's own restart answered at `running`, with no member, and nothing was asked)
        expelled = wait_for_event(workdir, run_id, lambda e: e["what"] == "policy"
                                  and e.get("action") == "expel" and e.get("node") == node,
                                  "the judge's expel of the old torchrun")
        assert "taken out of the rendezvous at once" in expelled[0]["text"], expelled
        policy = [e for e in judge_events(workdir, run_id) if e["what"] == "policy"]
        assert any("restarting %s" % node in e["text"] for e in policy), policy
        # kept in the node's action log as the judge's, beside the consoles' (`rankdeck actions`):
        # the restart and the expel of its old torchrun, both written by the writer serve uses
        # (agent/node/door.py), the expel in the log of the node it was done for. "at once": the
        # store found the dead entry still there and removed it, so the survivors' round did
        # not wait for it to expire (a late expel says it was out of the rendezvous already)
        logged: list = []

        def in_the_log() -> bool:
            logged[:] = json.loads(rankdeck("actions", run_id, "--json", env=UNBUFFERED).stdout)
            return any(a["action"] == "expel" and a["node"] == node for a in logged)
        wait_for_sync(in_the_log, 60, lambda: "the judge's expel in the action log: %s" % logged)
        assert any(a["action"] == "restart" and a["node"] == node and a["who"] == "judge"
                   and a["result"] == "ok" for a in logged), logged
        expel = [a for a in logged if a["action"] == "expel" and a["node"] == node]
        assert [(a["who"], a["result"]) for a in expel] == [("judge", "ok")], expel
        assert "old torchrun" in expel[0]["detail"], expel
        # every rank steps again past the hang
        steps: list = []

        def stepping_again() -> bool:
            status = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
            steps[:] = [r["step"] for n in status["nodes"] for r in n["ranks"]]
            return len(steps) == 2 and all(s is not None and s > 9 for s in steps)
        wait_for_sync(stepping_again, TIMEOUT, lambda: "every rank past step 9: %s" % steps,
                      every=2.0)
    finally:
        stop(run_id)


def test_a_detached_run_whose_rank_aborts_after_the_last_step_ends_failed_and_notifies(tmp_path):
    notified = tmp_path / "notified.jsonl"
    run_id, workdir = launch_detached(
        tmp_path, ["--steps", "12", "--ckpt-every", "0", "--abort-at-exit", "1"],
        "--max-restarts", "2", "--notify", "cat >> %s" % notified,
        "--notify-on", "failed,succeeded", nodes=2)
    try:
        ended = wait_for_event(workdir, run_id, lambda e: e["what"] == "run_ended", "the end")
        assert ended[0]["state"] == "failed", ended
        assert "after its last step" in ended[0]["text"], ended
        status = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
        assert status["state"] == "failed", status["state"]
        wait_for_sync(lambda: notified.exists() and notified.read_text().strip(), 60,
                      "the end notified", every=0.5)
        kinds = [json.loads(line)["kind"] for line in notified.read_text().splitlines()]
        assert kinds == ["failed"], kinds  # once, and only the kinds asked for
    finally:
        stop(run_id)


def test_max_wall_stops_a_detached_run_at_its_limit_with_the_cause_and_nothing_left(tmp_path):
    """`--max-wall`: the judge alone stops the run that long after it started; the run ends
    `stopped` with the limit as every node's cause, and no process of the run is left (the
    supervisors, torchrun and its workers, the store, the judge)."""
    run_id, workdir = launch_detached(tmp_path, ["--steps", "100000", "--ckpt-every", "0"],
                                      "--max-wall", "20", nodes=2)
    try:
        policy = wait_for_event(workdir, run_id, lambda e: e["what"] == "policy", "the limit")
        assert policy[0]["action"] == "stop", policy
        assert policy[0]["text"] == "--max-wall 20 s reached: stopping the run", policy
        ended = wait_for_event(workdir, run_id, lambda e: e["what"] == "run_ended", "the end")
        assert ended[0]["state"] == "stopped", ended
        # at the limit, not before: from the judge's start (its state.json, on its host)
        judge = read_json(os.path.join(workdir, ".rankdeck", "runs", run_id, "judge",
                                       "state.json"))
        assert policy[0]["ts"] >= judge["started"] + 20, (judge, policy)
        all_ended(run_id)  # nothing of the run is left, with no console to stop anything
        status = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
        assert status["state"] == "stopped", status["state"]
        causes = [n["cause"] for n in status["nodes"]]
        assert all("--max-wall 20 s reached" in str(c) for c in causes), causes
    finally:
        stop(run_id)
