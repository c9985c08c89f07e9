"""Two consoles on one run: one drives, one only watches (issue 30).

Real torchrun and the reference trainer on 2 local nodes, launched with `--detach`. A driving
console (alice) and a read-only TUI (bob, `rankdeck watch`) attach. Bob's console binds and
shows no key that changes the run; pressing each of them (and confirming) changes nothing,
and a request crafted on his connections is refused by the agents themselves. Alice restarts
node1: bob's events pane shows it with who did it, and `rankdeck actions` lists it.

What reached the hosts is proven from their side: every `serve` logs the op of each request
(agent/serve/server.py OPS_LOG), and the nodes' action logs record every change asked for.
"""

from __future__ import annotations

import json
import os

import pytest

from agent.serve.server import OPS_LOG
from console.verbs.recorded import recorded_run
from console.errors import AgentError
from textual.binding import BindingsMap

from console.tui.app import RankdeckApp
from console.tui.help import key_sections
from console.tui.readonly import changes_run

from tests.cli import rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_until

from .helpers import TINY, TRAINER, node_dir, wind_down

pytestmark = pytest.mark.e2e
SIZE = (160, 48)
CHANGE_OPS = {"start", "stop", "restart", "sync_commit", "fence", "unfence", "store_stop",
              "judge_stop"}


def launch(tmp_path) -> tuple[str, str]:
    """The run's id and the folder of the nodes' workdirs (``<it>/node0``: each its own, as
    two hosts have, for --sync)."""
    workdir = tmp_path / "work"
    inv = write_inventory(tmp_path, [workdir / ("node%d" % i) for i in range(2)], 2)
    code = tmp_path / "code"  # sent with --sync: an action of the launching console
    code.mkdir()
    (code / "notes.txt").write_text("synced\n")
    out = rankdeck("launch", "--detach", "--skip-preflight", "-i", inv, "--max-restarts", "3", "--sync",
                   str(code),
                   TRAINER, "--", *TINY, "--steps", "100000", "--ckpt-every", "0",
                   "--idle-s", "0.5", check=True)
    return out.stdout.strip().splitlines()[-1], str(workdir)


def ops_of(path, pids: set[int]) -> list[str]:
    """The ops the serves ``pids`` handled (OPS_LOG lines: ``<pid> <op>``)."""
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return []
    return [op for pid, _sp, op in (line.partition(" ") for line in lines) if int(pid) in pids]


def action_log(workdir, run_id, node) -> list[dict]:
    path = os.path.join(node_dir(os.path.join(workdir, node), run_id, node), "actions.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


async def test_a_watcher_changes_nothing_and_sees_who_drives(tmp_path, monkeypatch):
    ops = tmp_path / "serve-ops.log"
    monkeypatch.setenv(OPS_LOG, str(ops))
    run_id, workdir = launch(tmp_path)
    alice = recorded_run(run_id)
    bob = recorded_run(run_id)
    alice.me.who, alice.me.attach = "alice@laptop", True
    bob.me.who, bob.me.read_only, bob.me.attach = "bob@laptop", True, True
    try:
        assert not await alice.connect_all()
        await alice.subscribe_all()
        assert not await bob.connect_all()
        bob_pids = {link.hello["pid"] for link in bob.links.values()}
        app = RankdeckApp(bob, bob.subscribe_all)
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: "READ-ONLY · 2 consoles · alice@laptop drives"
                             in app.header.info().plain, what="the header says who drives",
                             timeout=120)
            await wait_until(pilot, lambda: all(bob.state.nodes[n].state == "running"
                                                for n in ("node0", "node1")),
                             what="both nodes running", timeout=120)

            # no key that changes the run is bound, in the footer or in the help
            # (the app's and every widget's on the screen, as their classes bind them)
            classes = {RankdeckApp} | {type(w) for w in app.screen.walk_children()}
            bound = [BindingsMap(getattr(cls, "BINDINGS", [])) for cls in classes]
            changing = [b for keys in bound for bs in keys.key_to_bindings.values()
                        for b in bs if changes_run(b.action)]
            assert {b.key for b in changing} >= {"k", "K", "r", "R"}
            active = app.screen.active_bindings
            assert not [k for k, a in active.items() if changes_run(a.binding.action)]
            helped = [row for _title, rows in key_sections(app) for row in rows]
            assert not [d for _k, d in helped if "Kill" in d or "Restart" in d], helped
            # pressing each, with a node selected, and confirming: nothing is asked
            app.screen.set_focus(app.nodes)
            for binding in changing:
                await pilot.press(binding.key, "y", "enter", "escape", "escape")
            # and in the dialogs that can restart a node: stacks (s), who is stuck (w)
            for opener, dialog in (("s", "StacksScreen"), ("w", "VerdictScreen")):
                await pilot.press(opener)
                await wait_until(pilot, lambda: type(app.screen).__name__ == dialog,
                                 what=dialog)
                active = app.screen.active_bindings
                assert "r" not in active and not [
                    k for k, a in active.items() if changes_run(a.binding.action)], dialog
                await pilot.press("r", "y", "enter", "escape", "escape")
            await pilot.pause()
            palette = [c.title for c in app.get_system_commands(app.screen)]
            assert not [t for t in palette if t.startswith(("Kill", "Restart"))], palette

            # a request crafted on bob's connection: the agent refuses it
            for op in ("stop", "restart"):
                with pytest.raises(AgentError) as refused:
                    await bob.links["node1"].request(op, run_root=bob.links["node1"].run_root,
                                                     node="node1", timeout=60)
                assert refused.value.kind == "read-only" and "read-only" in str(refused.value)
            assert not set(ops_of(ops, bob_pids)) & (CHANGE_OPS - {"stop", "restart"})
            # the refused tries are logged as bob's, and nothing else of his
            bobs = [e for e in action_log(workdir, run_id, "node1") if e["who"] == "bob@laptop"]
            assert [(e["action"], e["result"].split(":")[0]) for e in bobs] == [
                ("stop", "read-only"), ("restart", "read-only")]
            assert not [e for e in action_log(workdir, run_id, "node0")
                        if e["who"] == "bob@laptop"]
            assert all(bob.state.nodes[n].state == "running" for n in ("node0", "node1"))

            # alice restarts node1: bob sees it, with who did it
            results = await alice.restart("node1")
            assert not isinstance(results["node1"], BaseException), results
            seen = "alice@laptop (login %s) restarted node1: ok" % \
                alice.links["node1"].hello["login"]
            await wait_until(pilot, lambda: any(seen in line for line in app.events.shown),
                             what="alice's restart in bob's events pane", timeout=120)
            assert not [line for line in app.events.shown if "bob@laptop" in line]  # his own

        listed = rankdeck("actions", run_id, check=True).stdout
        assert seen in listed and "bob@laptop" in listed, listed
        as_json = json.loads(rankdeck("actions", run_id, "--json", check=True).stdout)
        alices = [a for a in as_json if a["who"] == "alice@laptop"]
        assert [(a["action"], a["node"], a["result"]) for a in alices][:1] == [
            ("restart", "node1", "ok")], alices
        # ... and what came of it on the store's host (node0): node1's old torchrun taken out
        # of the rendezvous (console/surgery/expel.py; not asked when the restart named none)
        assert all(a["action"] == "expel" and a["node"] == "node0" and "node1's dead torchrun"
                   in a.get("detail", "") for a in alices[1:]) and len(alices) <= 2, alices
        assert [a["action"] for a in as_json if a["node"] == "node0"][:2] == ["sync", "launch"]
    finally:
        await bob.close()
        assert not await wind_down(alice)
