"""The TUI on real runs: a Pilot test on 2 local nodes with real torchrun, and `rankdeck demo`
in a real terminal (tmux at 160x48) read back with capture-pane."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from console.tui.app import RankdeckApp
from console.tui.confirm import ConfirmScreen
from console.model.sources import RANK

from agent.host.journal import JournalReader
from console.lines.sanitize import clean

from tests.cli import rankdeck
from tests.waits import wait_for_sync, wait_until
from tests.spine.helpers import REPO, TINY, TRAINER, local_inventory, node_dir, processes_of

pytestmark = pytest.mark.e2e
SIZE = (160, 48)
TIMEOUT = 300


until = functools.partial(wait_until, timeout=TIMEOUT, every=0.2)  # real runs: slower


def journal_lines(workdir, run_id, node, rank) -> list[str]:
    """Every complete line of ``rank`` in a node's journal, in order (as the host wrote them)."""
    ranks, partial, out = {}, {}, []
    path = os.path.join(node_dir(workdir, run_id, node), "journal")
    for meta, data, _end in JournalReader(path).read(1 << 30):
        if meta["k"] == "file":
            ranks[meta["f"]] = meta.get("rank")
        elif meta["k"] == "data" and ranks.get(meta["f"]) == rank:
            parts = (partial.pop(meta["f"], "") + data.decode("utf-8", "replace")).split("\n")
            partial[meta["f"]] = parts.pop()
            out.extend(clean(line) for line in parts)
    return out


async def test_restart_a_node_from_the_tui_and_its_pane_goes_on(tmp_path):
    """...and scrolling up past what memory keeps brings every older line from the hosts."""
    # 2 local nodes: rank 1's node restarts, rank 0's worker restarts with it (each node more
    # is its torchrun's and worker's start-up, the test's time)
    ctl = RunController(local_inventory(tmp_path / "work", n=2), LocalTransport(), History())
    # Little memory, small pages: scrolling back must page. Rank 1 has printed at least 9 lines
    # before the restart and 5 after it when Home is pressed: 8 or more (~600 bytes, one
    # journal record a line or two) are beyond memory, so at least 2 pages of 150 bytes.
    ctl.state.lines_per_rank = 6
    ctl.page_bytes = 150
    spec = LaunchSpec(script=TRAINER, max_restarts=2, grace=3,
                      args=TINY + ["--steps", "100000", "--ckpt-every", "5"])
    seen = []
    ctl.state.change_listeners.append(lambda node: seen.append((node, ctl.state.nodes[node]
                                                                .state)))
    app = RankdeckApp(ctl, lambda: ctl.launch(spec, preflight=False))
    try:
        async with app.run_test(size=SIZE) as pilot:
            ranks = ctl.state.ranks
            await until(pilot, lambda: len(ranks) == 2 and all(
                (r.step or 0) >= 7 for r in ranks.values()), what="all ranks past step 7")
            rank = ranks[1]
            app.logs.show((RANK, 1))
            pane = [p for p in app.logs.panes if p.source == (RANK, 1)][0]
            await until(pilot, lambda: any("step=7 " in l for l in pane.view.lines_text()),
                        what="rank 1's steps in its pane")
            node = rank.node
            app.nodes.focus()
            app.nodes.move_to("n:" + node)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            asked = time.time()
            await pilot.press("y")
            await until(pilot, lambda: (node, "restarting") in seen, what="node restarting")
            await until(pilot, lambda: ctl.state.nodes[node].restarts == 1 and
                        app.nodes.row_values("n:" + node)[1] == "running",
                        what="node running again in the table")
            # the resume line itself may be out of the pane's 6 kept lines before a look (a
            # batch can bring it with 6 steps after it): the run's event says where they
            # resumed, and the Home check below finds the line in rank 1's whole log
            at = await until(pilot, lambda: resumed_step(ctl, asked),
                             what="the ranks resumed from a checkpoint")
            await until(pilot, lambda: any(int(m.group(1)) >= at + 2 for m in (
                re.match(r"step=(\d+) ", line) for line in pane.view.lines_text()) if m),
                        what="rank 1 stepping after the resume, in its pane")

            # Home: the start of rank 1's log, read back from the hosts' journals page by page
            pane.view.focus()
            title = pane.query_one(".logpane--title")
            pages = 0
            while "start of log" not in str(title.render()):
                had = len(pane.view.window.entries)
                await pilot.press("home")
                await until(pilot, lambda: len(pane.view.window.entries) > had or
                            "start of log" in str(title.render()), what="a page of older lines")
                assert "older lines:" not in str(title.render()), str(title.render())
                pages += 1
                assert pages < 100
            assert pages >= 2 and pane._scrollback.fetches >= 2  # several pages, really fetched
            shown = list(pane.view.window.entries)
    finally:
        await ctl.stop()
        await ctl.close()
    assert processes_of(ctl.run_id) == []
    # the very start of the log is there: the trainer's first line of rank 1
    assert any(e[3].startswith("rank=1 local_rank=0 world_size=2") for e in shown[:10]), shown[:10]
    for node in ctl.state.nodes:  # every line of rank 1 each host has, once and in order
        here = [e[3] for e in shown if e[1] == node]
        assert here == journal_lines(tmp_path / "work", ctl.run_id, node, 1)[:len(here)], node
    assert len(shown) > 6


def resumed_step(ctl, since: float) -> int | None:
    """The checkpoint step the run's ranks resumed from after ``since`` (its event), or None."""
    for e in list(ctl.state.events):
        if e.kind == "resumed" and (e.ts or 0) >= since:
            return int(re.search(r"checkpoint step (\d+)", e.text).group(1))
    return None


def tmux(*args, **kw):
    """tmux on a server of this test's own, so no other session's sizes or options apply."""
    return subprocess.run(["tmux", "-f", "/dev/null", "-L", "rdk-test-%d" % os.getpid()]
                          + list(args), **kw)


def capture(session: str) -> str:
    return tmux("capture-pane", "-t", session, "-p", capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_demo_in_a_real_terminal(tmp_path):
    session = "rdk-test-%d" % os.getpid()
    state = tmp_path / "state"
    cmd = ("cd %s && XDG_STATE_HOME=%s %s -m console demo --steps 100000 -- %s"
           % (REPO, state, sys.executable, " ".join(TINY)))
    # COLUMNS/LINES from pytest's environment would override the terminal's real size
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48",
         "env", "-u", "COLUMNS", "-u", "LINES", "PYTHONPATH=%s" % REPO, "TERM=xterm-256color",
         "sh", "-c", cmd, check=True)
    tmux("set-option", "-t", session, "window-size", "manual")
    tmux("resize-window", "-t", session, "-x", "160", "-y", "48")
    screen = ""

    def drawn() -> bool:
        nonlocal screen
        screen = capture(session)
        # two panes of steps: side by side where whole lines fit, stacked where not (align.py)
        panes = set(re.findall(r"rank \d+ @node\d/lr\d", screen))
        steps = len(re.findall(r"step=\d+ loss=", screen))
        return all(n in screen for n in ("node0", "node1", "node2", "node3")) and \
            bool(re.search(r"loss\s+\d+\.\d{3}", screen)) and len(panes) >= 2 and steps >= 2

    try:
        try:
            wait_for_sync(drawn, TIMEOUT, lambda: "every node, the loss and two panes of steps "
                          "on the screen:\n" + screen, every=1.0)
        finally:
            (tmp_path / "screen.txt").write_text(screen)
        tmux("send-keys", "-t", session, "q")
        # q detaches: the demo exits, and its tmux session with it
        wait_for_sync(lambda: tmux("has-session", "-t", session, capture_output=True).returncode,
                      60, lambda: "the demo to quit on q; the screen:\n" + capture(session))
    finally:
        tmux("kill-server", capture_output=True)
        runs_dir = state / "rankdeck" / "runs"
        run_ids = [r[:-5] for r in os.listdir(runs_dir) if r.endswith(".json")] \
            if runs_dir.exists() else []
        for run_id in run_ids:
            rankdeck("stop", run_id, env={"XDG_STATE_HOME": str(state)})
            left = processes_of(run_id)
            for pid, _cmd in left:
                os.kill(pid, 9)
            assert left == [], "the demo run was not stopped: %s" % left
