"""Who is stuck, in the view (Pilot, a real RunController over the scripted transport whose
agents answer ``why`` and ``stacks`` as the real one does for a run where rank 5 on node3
sleeps in Python while the others wait in an all-reduce): the suspect row stands out, the
cursor goes to its node, ``w`` says why, ``s`` shows the stacks, and the node is restarted
in at most four keys from the stall report."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from console.tui.app import RankdeckApp
from console.tui.confirm import ConfirmScreen
from console.tui.help import HelpScreen
from console.tui.stacks import StacksScreen
from console.tui.styles import SUSPECT_STYLE
from console.tui.verdict import VerdictScreen

from tests.waits import wait_until
from tests.console.scripted import controller, host_names, standard_script
from tests.console.test_tui import help_rows
from tests.spine.helpers import TINY, TRAINER, local_inventory, processes_of
from tests.unit.test_verdict import STUCK_STACK, WAITING_STACK

pytestmark = pytest.mark.usefixtures("own_home")

SIZE = (160, 48)
SUSPECT, SUSPECT_NODE = 5, "node3"  # node3 holds ranks 4 and 5


def collective(seq: int, done: bool = True) -> dict:
    return {"pg": "0", "seq": seq, "p2p": False, "op": "gloo:all_reduce", "in": [[21600]],
            "out": [[21600]], "done": done, "t_ns": seq * 10**9}


def rank_report(rank: int) -> dict:
    """What the agent's ``why`` sends for a rank (agent/torchrun/fr_dump.py): rank 5 finished #4 and
    sleeps in Python; the others wait in #5."""
    stuck = rank == SUSPECT
    return {"rank": rank, "pid": 1000 + rank, "method": "py-spy",
            "stack": STUCK_STACK if stuck else WAITING_STACK,
            "sources": {"trainer/faults.py:87": "time.sleep(3600)",
                        "trainer/train.py:238": "loss.backward()"},
            "fr": {"entries": [collective(4)] + ([] if stuck else [collective(5, done=False)])}}


def answering_why(t) -> None:
    """Make the scripted agents answer ``why`` and ``stacks`` for the hung run."""
    plain = t._answer

    def answer(stream, req_id, req):
        if req.op not in ("why", "stacks"):
            return plain(stream, req_id, req)
        first = host_names(4).index(stream.node.name) * 2
        ranks = [rank_report(r) for r in (first, first + 1)]
        if req.op == "stacks":
            ranks = [{k: r[k] for k in ("rank", "pid", "method", "stack")} for r in ranks]
        stream.send({"t": "res", "id": req_id, "ok": True, "data": {"ranks": ranks}})
    t._answer = answer


def hung_app(tmp_path):
    """A run whose last step is long past: its ranks stall at the first check (1 s)."""
    t = standard_script(host_names(4), t0=time.time() - 100).transport()
    answering_why(t)
    ctl, launch = controller(str(tmp_path), t, steps=None)
    ctl.state.stall_min_s = 2.0
    return RankdeckApp(ctl, launch), ctl, t


async def stall_report(pilot, app) -> None:
    """Until the controller's own verdict (taken when the ranks stalled) is in the view."""
    await wait_until(pilot, lambda: app.ctl.state.verdict is not None, timeout=30,
                     what="the verdict after the stall")
    await wait_until(pilot, lambda: app.nodes.cursor_key == "n:" + SUSPECT_NODE,
                     what="the cursor on the suspect's node")


async def restart_confirmed(pilot, app, t, keys: list[str]) -> None:
    """``r`` (asks), ``y``: the suspect's node is restarted."""
    assert keys == ["r", "y"]
    await pilot.press(keys[0])
    await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
    await pilot.press(keys[1])
    await wait_until(pilot, lambda: t.ops("restart") == [SUSPECT_NODE], what="node3 restarted")


def text_of(screen, selector: str) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(screen.query_one(selector).content)
    return console.export_text()


async def test_from_the_stall_report_to_the_suspects_node_restarted_in_four_keys(tmp_path):
    app, ctl, t = hung_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await stall_report(pilot, app)
        # the suspect's row stands out; a rank merely waiting says on what
        suspect = app.nodes.row_lines("r:%d" % SUSPECT)[0]
        waiting = app.nodes.row_lines("r:4")[0]
        assert suspect[0][1] == SUSPECT_STYLE and waiting[0][1] != SUSPECT_STYLE
        assert suspect[-1] == ("suspect: trainer/faults.py:87 in injected_hang", SUSPECT_STYLE)
        assert waiting[-1][0] == "waits in gloo:all_reduce #5"
        assert app.nodes.row_lines("n:" + SUSPECT_NODE)[0][0][1] == SUSPECT_STYLE
        assert app.nodes.row_lines("n:node1")[0][0][1] != SUSPECT_STYLE

        keys = ["w", "r", "y"]
        await pilot.press(keys[0])
        await wait_until(pilot, lambda: isinstance(app.screen, VerdictScreen), what="the verdict")
        shown = text_of(app.screen, "#verdict-body")
        assert "stuck-in-python" in shown
        assert "rank 5 on node3  at trainer/faults.py:87 in injected_hang" in shown
        assert "> time.sleep(3600)" in shown  # the source line, read on the host
        assert "rank(s) 0-4,6-7 wait in gloo:all_reduce #5 (pg 0) sizes [[21600]]" in shown
        await restart_confirmed(pilot, app, t, keys[1:])
        assert len(keys) <= 4
        assert t.ops("stop") == []


async def test_the_cursor_is_already_there_so_r_y_restarts_the_suspect(tmp_path):
    app, ctl, t = hung_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await stall_report(pilot, app)
        await restart_confirmed(pilot, app, t, ["r", "y"])


async def test_s_shows_the_selected_nodes_stacks_with_the_odd_rank_marked(tmp_path):
    app, ctl, t = hung_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await stall_report(pilot, app)
        await pilot.press("s")
        await wait_until(pilot, lambda: isinstance(app.screen, StacksScreen), what="the stacks")
        await wait_until(pilot, lambda: "r4" in text_of(app.screen, "#stacks-body"),
                         what="node3's stacks")
        lines = text_of(app.screen, "#stacks-body").splitlines()
        marked = [line.split()[0] for line in lines if "differs from the majority" in line]
        assert marked == ["r5"], lines
        assert "    injected_hang (trainer/faults.py:87)" in lines
        assert not any(line.startswith(("r0", "r1", "r6")) for line in lines)  # node3's only
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, StacksScreen))
        # another node, chosen in the table: its stacks, nothing odd on it
        app.nodes.move_to("n:node1")
        await pilot.press("s")
        await wait_until(pilot, lambda: "r0" in text_of(app.screen, "#stacks-body"),
                         what="node1's stacks")
        shown = text_of(app.screen, "#stacks-body")
        assert "differs" not in shown.split("odd rank(s) out")[0]
        assert "odd rank(s) out on other nodes: r5 on node3" in shown
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("n")
        await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="no")
        assert t.ops("restart") == []
        # a restart after "y" is done: one that "n" had started would be done too
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        await wait_until(pilot, lambda: any(n.title.startswith("restart ")
                                            for n in app._notifications), what="its result")
        assert len(t.ops("restart")) == 1, t.ops("restart")


async def test_w_asks_for_a_fresh_verdict_and_help_lists_the_keys(tmp_path):
    app, ctl, t = hung_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await stall_report(pilot, app)
        asked = len(t.ops("why"))
        await pilot.press("w")
        await wait_until(pilot, lambda: isinstance(app.screen, VerdictScreen), what="the verdict")
        await pilot.press("w")  # ask again: two more samples of every node
        await wait_until(pilot, lambda: len(t.ops("why")) >= asked + 8, what="a fresh verdict")
        await wait_until(pilot, lambda: "time.sleep(3600)" in text_of(app.screen, "#verdict-body"),
                         what="the fresh verdict shown")
        await pilot.press("escape")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        rows = help_rows(app.screen)
        assert "w" in rows["Who is stuck"] and "s" in rows["Stacks of the node"]
        assert "W" in rows["Wrap"]
        assert "w" in rows["Take a fresh verdict now"]
        assert "r" in rows["Restart the suspect's node (asks first)"]
        assert "s" in rows["Take the stacks again"]


@pytest.mark.e2e
async def test_a_real_hung_rank_is_named_and_its_node_restarted_from_the_view(tmp_path):
    """2 local nodes, real torchrun and gloo, rank 1 sleeping in Python before step 6: the
    cursor goes to its node, `w` shows its source line, `r` `y` restart it, and the run steps
    again (the trainer's fault fires once per run)."""
    # 2 nodes: the hung rank and a peer waiting for it are all a hang needs (the verdict of
    # tests/spine/test_stuck.py names rank 1 of 2 so); each node more is its torchrun's and
    # worker's start-up, the test's time
    ctl = RunController(local_inventory(tmp_path / "work", n=2), LocalTransport(), History())
    spec = LaunchSpec(script=TRAINER, max_restarts=2, grace=3, stall_after=6.0, args=TINY + [
        "--steps", "100000", "--ckpt-every", "0", "--pg-timeout", "600",
        "--hang-at-step", "6", "--hang-rank", "1"])
    app = RankdeckApp(ctl, lambda: ctl.launch(spec, preflight=False))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: (ctl.state.verdict or {}).get("suspects"), timeout=300,
                             what="the verdict after the hang", every=0.2)
            node = ctl.state.ranks[1].node
            assert [s["rank"] for s in ctl.state.verdict["suspects"]] == [1]
            await wait_until(pilot, lambda: app.nodes.cursor_key == "n:" + node,
                             what="the cursor on rank 1's node")
            await pilot.press("w")
            await wait_until(pilot, lambda: isinstance(app.screen, VerdictScreen),
                             what="the verdict")
            assert "> time.sleep(3600)" in text_of(app.screen, "#verdict-body")
            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen),
                             what="the question")
            restarted_at = time.time()
            await pilot.press("y")
            await wait_until(pilot, lambda: ctl.state.nodes[node].restarts == 1, timeout=120,
                             what="rank 1's node restarted", every=0.2)
            await wait_until(pilot, lambda: len(ctl.state.ranks) == 2 and all(
                (r.last_progress or 0) > restarted_at for r in ctl.state.ranks.values()),
                timeout=300, what="every rank stepping again", every=0.2)
            assert ctl.state.verdict is None  # the stall it was about has ended
    finally:
        await ctl.stop()
        await ctl.close()
    assert processes_of(ctl.run_id) == []
