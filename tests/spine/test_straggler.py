"""Stragglers, continuously, with real parts: 4 ranks on 2 local nodes, torchrun, gloo, the
reference trainer's ``--slow-rank``; the supervisors sample the flight recorder every 2 s
(agent/supervisor/ranksample.py) and the console names the rank the others wait for
(agent/rules/straggler.py) in ``status --json``, in events and in ``why``'s verdict; a clean run
names nobody.

The two runs (one with a slow rank, one clean) are watched side by side by one module fixture:
each of them is mostly a wait for sample ticks, which the other's fills, so the module takes
about one run's time instead of two. Each run's watch records what its test asserts, then
winds that run down at once (the clean run's ranks busy every core until then)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from agent.rules.straggler import MIN_TICKS, SHARE_MIN, WINDOW
from console.transport.local import LocalTransport

from tests.waits import wait_for

from .helpers import TINY, TRAINER, local_inventory, outcome, watched

pytestmark = pytest.mark.e2e
TIMEOUT = 300
SAMPLE_S = "2"


def _controller(folder) -> RunController:
    # 4 ranks (a straggler is named against the median of at least 3: agent/rules/straggler.py
    # ``shares``) on 2 nodes of 2: each node less is one torchrun's torch start-up less
    return RunController(local_inventory(folder / "work", n=2), LocalTransport(), History())


async def _launch(ctl: RunController, extra: list[str]) -> None:
    await ctl.launch(LaunchSpec(script=TRAINER, max_restarts=0, grace=3, nproc_per_node=2,
                                env={"RANKDECK_SAMPLE_S": SAMPLE_S},
                                args=TINY + ["--steps", "100000", "--ckpt-every", "0"] + extra),
                     preflight=False)


def _ranks(status: dict) -> dict[int, dict]:
    return {r["rank"]: dict(r, node=n["name"]) for n in status["nodes"] for r in n["ranks"]}


def _shares(ctl) -> dict[int, list[float]]:
    """Every rank's shares, newest last: printed (-s) for docs/BENCHMARKS.md and on failure."""
    shares = {r: [round(s, 3) for s in h] for r, h in sorted(ctl.state.stragglers.history.items())}
    print("shares a rank, a tick:", shares)
    return shares


def _sampled(ctl, ticks: int) -> bool:
    """Every rank has ``ticks`` shares (the decision has had its window)."""
    history = ctl.state.stragglers.history
    return len(history) == 4 and all(len(h) >= ticks for h in history.values())


async def _watch_slow(ctl: RunController, got: SimpleNamespace) -> None:
    """The run with a slow rank: once it is flagged and a full window of samples is in, what
    `status`, the events and `why` say."""
    await _launch(ctl, ["--slow-rank", "1", "--slow-s", "1.0"])
    await wait_for(lambda: ctl.state.stragglers.flagged, TIMEOUT, "a straggler flagged")
    await wait_for(lambda: _sampled(ctl, WINDOW), TIMEOUT, "a full window of samples")
    got.ranks, got.shares = _ranks(ctl.status()), _shares(ctl)
    got.events = list(ctl.state.events)
    got.verdict = await ctl.why()  # `why` on the same run


async def _watch_clean(ctl: RunController, got: SimpleNamespace) -> None:
    """The clean run: once every rank has had MIN_TICKS + WINDOW samples, what `status` and
    the events say."""
    await _launch(ctl, [])
    await wait_for(lambda: _sampled(ctl, MIN_TICKS + WINDOW), TIMEOUT, "samples of every rank")
    got.ranks, got.shares = _ranks(ctl.status()), _shares(ctl)
    got.events = list(ctl.state.events)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, SimpleNamespace]:
    """Both runs, launched together and watched side by side until each has what its test
    reads: ``{"slow": ..., "clean": ...}``, each with ``error`` (its watch's failure, or
    None), ``left`` (its processes alive after its wind-down) and what the watch recorded."""
    slow = _controller(tmp_path_factory.mktemp("slow"))
    clean = _controller(tmp_path_factory.mktemp("clean"))

    async def both():
        return await asyncio.gather(watched(slow, _watch_slow), watched(clean, _watch_clean))

    got_slow, got_clean = asyncio.run(both())
    return {"slow": got_slow, "clean": got_clean}


def test_the_slow_rank_and_its_node_are_flagged_and_no_other(runs):
    run = outcome(runs["slow"])
    ranks, shares = run.ranks, run.shares
    assert [r for r, v in ranks.items() if v["straggler"]] == [1], (ranks, shares)
    assert ranks[1]["slowdown"] > 1.5, ranks  # 1 s a step more than steps of ms
    # the others under a straggler's slowdown: a loaded 2-core box makes a healthy rank
    # late now and then (shares of 0.1-0.2, slowdown up to 1.25: seen 1.10 on rank 3)
    assert all(v["slowdown"] < 1 / (1 - SHARE_MIN) for r, v in ranks.items() if r != 1), \
        ranks
    flagged = [e for e in run.events if e.kind == "straggler"]
    assert [(e.rank, e.node) for e in flagged] == [(1, ranks[1]["node"])], flagged
    # `why` on the same run: nobody hung, rank 1 the one the others wait for
    verdict = run.verdict
    assert verdict["kind"] == "straggler", verdict
    assert [(s["rank"], s["node"]) for s in verdict["suspects"]] == [(1, ranks[1]["node"])]
    assert verdict["evidence"]["share"]["1"] > 0.5, verdict["evidence"]
    assert run.left == [], "processes left behind: %s" % run.left


def test_a_clean_run_flags_nobody(runs):
    run = outcome(runs["clean"])
    ranks, shares = run.ranks, run.shares
    assert not any(v["straggler"] for v in ranks.values()), (ranks, shares)
    assert all(v["slowdown"] is not None for v in ranks.values()), ranks
    assert not [e for e in run.events if e.kind.startswith("straggler")]
    assert run.left == [], "processes left behind: %s" % run.left
