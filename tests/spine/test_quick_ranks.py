"""Ranks named from the first byte: workers that live for milliseconds, on local nodes.

A worker that prints one line and exits is gone before its /proc/<pid>/environ can be read;
its files still carry its global rank (from torchrun's own record of the worker group). A
rank that raises at import is named in its node's cause with its exception, secrets masked.
The quick script runs from workdirs written as `~/proj`, `proj`, `~` and `~/proj/`, which
the agent reads on the host. No script imports torch: these runs take torchrun's start-up
only, so two runs, not three: one quick run of 4 nodes x 2 ranks that two tests read (the
ranks its files carry, the workdirs it ran in), and the failing one on 2 nodes x 2 ranks.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import textwrap
from collections import defaultdict

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from inventory.model import EnvValue

from tests.waits import wait_for

from .helpers import local_inventory, node_dir, wind_down

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 300
SECRET = "tok-5ecret-93b1"


def write_script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.fixture
async def make_controller():
    """Controllers over local nodes; on the way out, stop whatever is still running."""
    made = []

    def make(inv):
        made.append(controller_of(inv))
        return made[-1]
    yield make
    left = [await wind_down(ctl) for ctl in made]  # never leave a run behind
    assert not any(left), "processes left behind: %s" % left


def controller_of(inv) -> RunController:
    for host in inv.hosts:  # a secret in every node's environment
        host.env = {"API_TOKEN": EnvValue(SECRET, secret=True)}
    return RunController(inv, LocalTransport(), History())


def worker_batches(ctl):
    got = []
    ctl.state.line_listeners.append(
        lambda b: got.append(b) if b.stream in ("stdout", "stderr") else None)
    return got


# each node's workdir as the inventory writes it, and where it is on the host (under HOME)
WORKDIRS = {"node0": "~/proj", "node1": "proj", "node2": "~", "node3": "~/proj/"}
WHERE = {"node0": "proj", "node1": "proj", "node2": "", "node3": "proj"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One run of a script that prints its rank and its folder and exits, on 4 local nodes of
    2 ranks each, their workdirs written with `~` and relative to HOME; run to its end here,
    for the tests below to read: (controller, its worker batches, HOME, final state)."""
    tmp = tmp_path_factory.mktemp("quick")
    home = tmp / "home"
    (home / "proj").mkdir(parents=True)
    body = "import os\nprint('hello from rank', os.environ['RANK'], 'in', os.getcwd())\n"
    (home / "proj" / "quick.py").write_text(body)
    (home / "quick.py").write_text(body)
    inv = local_inventory(tmp / "unused")
    for host in inv.hosts:
        host.workdir = WORKDIRS[host.name]
    ctl = controller_of(inv)
    got = worker_batches(ctl)

    async def run():
        try:
            await ctl.launch(LaunchSpec(script="quick.py", nproc_per_node=2, max_restarts=0),
                             preflight=False)
            final = await asyncio.wait_for(ctl.wait_done(), RUN_TIMEOUT)
            await ctl.stop_store()
            return final
        finally:
            left = await wind_down(ctl)  # never leave a run behind
            assert not left, "processes left behind: %s" % left

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))  # the agents (local transport) inherit it
        final = asyncio.run(run())
    return ctl, got, home, final


async def test_workers_of_milliseconds_carry_their_global_rank(quick_run):
    ctl, got, home, final = quick_run
    assert final == "succeeded", ctl.state.status()

    printed = defaultdict(list)
    for b in got:
        assert b.rank is not None, (b.node, b.path, b.lines)
        for line in b.lines:
            m = re.match(r"hello from rank (\d+)", line)
            if m:
                printed[b.node].append((int(m.group(1)), b.rank))
    pairs = [p for node in printed.values() for p in node]
    assert sorted(r for r, _ in pairs) == list(range(8)), printed
    assert all(said == tagged for said, tagged in pairs), printed
    assert sorted(ctl.state.ranks) == list(range(8))
    for rank in ctl.state.ranks.values():
        assert rank.node in printed and rank.rank in [r for r, _ in printed[rank.node]]
    # the ranks came from torchrun's record of its worker group (started through
    # agent/torchrun_log.BOOTSTRAP), which outlives the workers
    for node in ctl.state.nodes:
        folder = node_dir(home / WHERE[node], ctl.run_id, node)
        with open(os.path.join(folder, "torchrun-ranks.log")) as f:
            said = f.read()
        assert "Rendezvous complete for workers" in said and "global_ranks=[" in said, node
        with open(os.path.join(folder, "torchrun.log")) as f:
            assert "Rendezvous complete" not in f.read(), node  # the view is not flooded


async def test_rank_raising_at_import_is_named_with_its_exception(make_controller, tmp_path):
    # 2 nodes of 2 ranks: rank 3 shares its node with rank 2, which the failure ends too
    ctl = make_controller(local_inventory(tmp_path / "work", n=2))
    script = write_script(tmp_path, "crash.py", """\
        import os, time
        if os.environ["RANK"] == "3":
            raise RuntimeError("credential rejected: " + os.environ["API_TOKEN"])
        print("rank", os.environ["RANK"], "waiting", flush=True)
        time.sleep(120)
    """)
    got = worker_batches(ctl)
    await ctl.launch(LaunchSpec(script=script, nproc_per_node=2, max_restarts=0),
                     preflight=False)

    def failed():
        return [n for n in ctl.state.nodes.values() if n.state == "failed"]
    await wait_for(lambda: failed(), RUN_TIMEOUT, "the node of rank 3 to fail")
    await ctl.stop()

    bad = failed()
    assert len(bad) == 1, [(n.name, n.state, n.cause) for n in ctl.state.nodes.values()]
    node = bad[0]
    assert node.cause == "rank 3: RuntimeError: credential rejected: ****", node.cause
    assert ctl.state.ranks[3].node == node.name
    assert ctl.state.ranks[3].state == "failed"
    # every line, the traceback of the quick rank 3 included, carries its global rank
    assert all(b.rank is not None for b in got), [(b.node, b.path) for b in got
                                                   if b.rank is None]
    assert any(b.rank == 3 and "credential rejected" in b.text for b in got)
    # the cause is masked where it is kept too: the node's state.json and the status
    with open(os.path.join(node_dir(tmp_path / "work", ctl.run_id, node.name),
                           "state.json")) as f:
        state = json.load(f)
    assert state["cause"]["rank"] == 3 and SECRET not in json.dumps(state)
    assert SECRET not in json.dumps(ctl.state.status())


async def test_workdirs_with_tilde_and_relative_are_read_on_the_host(quick_run):
    ctl, got, home, final = quick_run
    assert final == "succeeded", ctl.state.status()
    said = {b.node: line for b in got for line in b.lines if line.startswith("hello")}
    expect = {node: home / where for node, where in WHERE.items()}
    for node, where in expect.items():
        assert said[node].endswith(" in %s" % where), said
        # the run folder and torchrun's --log-dir are under the expanded workdir too
        files = os.listdir(os.path.join(str(where), ".rankdeck", "runs", ctl.run_id, node,
                                        "torchrun"))
        assert files, node
