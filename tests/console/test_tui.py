"""Pilot tests of the rankdeck TUI on a real RunController over the scripted transport."""

from __future__ import annotations

import io
import time

import pytest
from rich.cells import cell_len
from rich.console import Console
from textual.widgets import Static

from console.lines.sanitize import clean
from console.model.state import RunState
from console.tui.app import RankdeckApp, run_app
from console.tui.confirm import ConfirmScreen
from console.tui.events import EventsLog, EventsScreen
from console.model.sources import ALL, NODE, RANK
from console.tui.help import HelpScreen
from console.tui.logs import default_sources, second_source
from console.tui.messages import RunChanged

from tests.waits import wait_until
from tests.console.scripted import (RUN_ID, T0, RunScript, controller, event, gpu_snapshot,
                                   host_names, no_gpu_snapshot, standard_script)

SIZE = (160, 48)


@pytest.fixture(autouse=True)
def _utc(own_home, monkeypatch):
    """Keep every test out of the real home directory (own_home) and local time zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


def build(tmp_path, script: RunScript | None = None, steps: int | None = 40, **transport):
    script = script or standard_script(host_names(4), t0=time.time())
    t = script.transport(**transport)
    ctl, launch = controller(str(tmp_path), t, steps=steps)
    return RankdeckApp(ctl, launch), ctl, t


async def running(pilot, app) -> None:
    """Launch done, every rank stepping and shown in the nodes table."""
    await wait_until(pilot, lambda: not app.launching, what="launch")
    await wait_until(pilot, lambda: (app.nodes.row_values("r:7") or ("", ""))[1] == "running",
                     what="rank rows running")
    await wait_until(pilot, lambda: app.logs.panes[0].view.lines_text(), what="pane lines")


def node_row(app, node):
    return app.nodes.row_values("n:" + node)


async def handled(pilot, message) -> None:
    """``message`` posted to the app and handled: a callback posted after it runs after its
    handler (one queue, in order)."""
    done: list = []
    pilot.app.post_message(message)
    pilot.app.call_later(done.append, True)
    await wait_until(pilot, lambda: done, what="%s handled" % type(message).__name__)


# -- launch progress and state ---------------------------------------------------------------
async def test_launch_progress_shows_each_phase(tmp_path):
    hosts = host_names(4)
    script = RunScript(hosts, 2, t0=time.time()).launched()  # workers up, no step yet
    app, ctl, t = build(tmp_path, script, hold={"open"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: [node_row(app, h)[1] for h in hosts] == ["connecting"] * 4,
                         what="every node connecting")
        assert "launching" in app.header.info().plain
        t.release()
        await wait_until(pilot, lambda: node_row(app, "node1")[1] == "rendezvous",
                         what="rendezvous phase")
        assert node_row(app, "node1")[-1] == "waiting for first step"
        assert app.nodes.row_values("r:0")[1] == "starting"
        live = RunScript(hosts, 2, t0=time.time())
        live.steps(1, 3)
        for node in hosts:
            for rec in live.recs[node]:
                t.node(node).append([rec])
        await wait_until(pilot, lambda: node_row(app, "node4")[1] == "running", what="running")
        assert node_row(app, "node4")[2] == "3"
        assert app.nodes.row_values("r:7")[2] == "3"


async def test_start_held_shows_starting(tmp_path):
    app, ctl, t = build(tmp_path, hold={"start"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: node_row(app, "node2")[1] == "starting", what="starting")
        assert node_row(app, "node2")[-1] == "starting torchrun"
        assert t.ops("store_start") == ["node1"]
        t.release()
        await running(pilot, app)
        assert node_row(app, "node2")[1] == "running"
        assert "step 24/40" in app.header.info().plain


async def test_unreachable_host_shows_cause_and_exit_code(tmp_path):
    app, ctl, t = build(tmp_path, unreachable={
        "node3": ("refused", "node3: connection refused (127.0.0.4:22)")})
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: not app.launching, what="launch to fail")
        await wait_until(pilot, lambda: node_row(app, "node3")[1] == "unreachable")
        row = node_row(app, "node3")
        assert "refused" in row[-1] and "connection refused" in row[-1]
        assert "launch failed" in app.header.info().plain
        assert t.ops("start") == []
        assert ctl.exit_code() == 3
        assert any("cannot reach" in n.message for n in app._notifications)


async def test_crashed_node_shows_failure_and_cause(tmp_path):
    hosts = host_names(4)
    script = standard_script(hosts, t0=time.time())
    script.crash("node2", 1, 1, "CUDA error: an illegal memory access was encountered",
                 time.time() + 30)
    app, ctl, t = build(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: node_row(app, "node2")[1] == "failed (1)", what="failed")
        row = node_row(app, "node2")
        assert "rank 3 (local 1) exited with code 1" in row[-1]
        assert app.nodes.row_values("r:3")[1] == "failed"
        assert node_row(app, "node1")[1] == "running"
        await wait_until(pilot, lambda: any(" failed " in s for s in app.events.shown))
        failed = [s for s in app.events.shown if " failed " in s]
        assert "node2/r3" in failed[0] and "illegal memory access" in failed[0]


# -- log panes ---------------------------------------------------------------------------------
async def test_pick_rank_per_pane(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        logs = app.logs
        assert [p.source for p in logs.panes] == [(RANK, 0), (RANK, 7)]
        await pilot.press("2", "g", "5", "enter")
        assert logs.panes[1].source == (RANK, 5)
        assert logs.panes[0].source == (RANK, 0)
        rank5 = "step 24 loss=%.4f" % (4.0 / (1 + 0.08 * 24) + 0.05 + 0.05 * ((24 * 7) % 5) / 5)
        assert any(line.startswith(rank5) for line in logs.panes[1].view.lines_text())
        assert "rank 5" in str(logs.panes[1].query_one(".logpane--title").render())
        await pilot.press("right_square_bracket")
        assert logs.panes[1].source == (RANK, 6)
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert logs.panes[1].source == (RANK, 4)
        # the nodes table picks for the active pane too
        app.nodes.focus()
        app.nodes.move_to("r:7")
        await pilot.press("enter")
        assert logs.panes[1].source == (RANK, 7)
        await pilot.press("plus", "plus", "plus")
        assert len(logs.panes) == 4
        await pilot.press("minus")
        assert len(logs.panes) == 3
        assert app.feed.watched == logs.sources


async def test_hidden_sources_get_no_writes_and_refill_when_shown(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        assert (RANK, 5) not in app.feed.watched
        live = RunScript(host_names(4), 2, t0=time.time())
        live.lines("node3", 1, ["only for rank five"], time.time())
        t.node("node3").append(live.recs["node3"])
        await wait_until(pilot, lambda: ctl.state.ranks[5].lines[-1] == "only for rank five")
        # a later line of a shown rank: once pane 1 shows it, the feed has flushed all it
        # held before it (rank 5's line too, had it kept that)
        later = RunScript(host_names(4), 2, t0=time.time())
        later.lines("node1", 0, ["for rank zero, later"], time.time())
        t.node("node1").append(later.recs["node1"])
        await wait_until(pilot, lambda: app.logs.panes[0].view.lines_text()[-1:] == [
            "for rank zero, later"], what="the later line in pane 1")
        for pane in app.logs.panes:
            assert "only for rank five" not in pane.view.lines_text()
        await pilot.press("g", "5", "enter")
        assert app.logs.active_pane.view.lines_text()[-1] == "only for rank five"


async def test_second_pane_shows_the_last_rank_once_known(tmp_path):
    hosts = host_names(4)
    app, ctl, t = build(tmp_path, hold={"open"})
    async with app.run_test(size=SIZE) as pilot:
        logs = app.logs
        await wait_until(pilot, lambda: logs.is_mounted and len(logs.panes) == 2, what="2 panes")
        assert [p.source for p in logs.panes] == [(RANK, 0), (NODE, "node4")]  # no ranks yet
        t.release()
        await running(pilot, app)
        await wait_until(pilot, lambda: logs.panes[1].source == (RANK, 7),
                         what="pane 2 on rank 7, the last")
        assert logs.panes[1].view.lines_text()[-1].startswith("step 24 ")
    # a pane the user chose before the ranks were known keeps its choice
    app, ctl, t = build(tmp_path / "chosen", standard_script(hosts, t0=time.time()),
                        hold={"open"})
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.logs.is_mounted and len(app.logs.panes) == 2,
                         what="2 panes")
        await pilot.press("2", "g", *"node2", "enter")
        await wait_until(pilot, lambda: app.logs.panes[1].source == (NODE, "node2"),
                         what="pane 2 on node2")
        t.release()
        await running(pilot, app)
        # a state refresh with every rank known: the one that moved pane 2 above
        assert second_source(ctl.state) == (RANK, 7)
        await handled(pilot, RunChanged())
        assert app.logs.panes[1].source == (NODE, "node2")


def test_second_pane_never_opens_on_rank_zeros_node_once_ranks_are_known():
    """Attached to a run whose first node is the only one known yet: pane 2 waits on that
    node (a placeholder the app replaces), not for good; no node known: every rank."""
    one = RunState("r", [("node0", "h0")])
    assert default_sources(one) == [(RANK, 0), (NODE, "node0")]
    assert second_source(one) is None  # nothing yet to replace the placeholder with
    assert default_sources(RunState("r", [])) == [(RANK, 0), (ALL, None)]


async def test_filter_regex_across_panes_highlights_matches(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        await pilot.press("slash", *"step 2[0-3] ", "enter")
        for pane in app.logs.panes:
            lines = pane.view.lines_text()
            assert lines and all("step 2" in line for line in lines), lines
            assert "match" in str(pane.query_one(".logpane--title").render())
        rank0 = app.logs.panes[0].view
        assert len(rank0.lines_text()) == 4
        match_bg = rank0.get_component_rich_style("logview--match").bgcolor
        segments = list(rank0.render_line(0))
        highlighted = [s.text for s in segments if s.style and s.style.bgcolor == match_bg]
        assert highlighted == ["step 20 "]
        # an invalid regex is refused, the filter in force stays
        await pilot.press("slash", "(")  # the prompt selects the old text: typing replaces it
        assert app.prompt.has_class("-invalid")
        assert len(rank0.lines_text()) == 4
        await pilot.press("escape")
        assert app.logs.pattern is None
        assert len(rank0.lines_text()) > 24


def late_line(ctl, node: str, rank: int, text: str) -> None:
    """One more line of ``rank`` into RunState, as a journal message from its node would."""
    ns = ctl.state.nodes[node]
    fid = [f.fid for f in ns.files.values() if f.rank == rank and f.stream == "stdout"][0]
    j = ns.journal_offset + 1
    ctl.state.apply_records(node, [[{"k": "data", "f": fid, "ts": time.time(), "j": j},
                                    text + "\n"]], j + 100)


async def test_a_line_right_after_a_switch_is_shown_once(tmp_path):
    """A pane that switches source misses no line arriving before the app handles the switch
    (all a finished run has may come in one burst), and shows none twice."""
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        app.logs.show((RANK, 5), pane=1)
        late_line(ctl, "node3", 5, "right after the switch")
        await wait_until(pilot, lambda: app.logs.panes[1].view.lines_text()[-1] == "right after "
                         "the switch", what="the line in the switched pane")
        late_line(ctl, "node1", 0, "pending when pane 2 shows rank 0")
        app.logs.show((RANK, 0), pane=1)  # pane 1 follows rank 0 too: that line is pending
        await wait_until(pilot, lambda: app.logs.panes[0].view.lines_text()[-1].startswith(
            "pending"), what="the feed's flush")
        # that flush wrote to every pane of rank 0 in the same handler: a second copy
        # would be there now
        for pane in app.logs.panes:
            assert pane.view.lines_text().count("pending when pane 2 shows rank 0") == 1


async def test_collapse_identical_lines_from_many_ranks(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        node1 = app.logs.panes[1].view
        await pilot.press("2", "g", *"node1", "enter")
        assert app.logs.panes[1].source == (NODE, "node1")
        assert "ranks 0-1: using device cuda:0, world size 8" in node1.lines_text()
        await pilot.press("1", "g", *"all", "enter")
        merged = app.logs.panes[0].view
        assert app.logs.panes[0].source == (ALL, None)
        # the older kept lines come in after the first paint
        await wait_until(pilot, lambda: "ranks 0-7: using device cuda:0, world size 8" in
                         merged.lines_text(), what="the backfill")
        await pilot.press("1", "c")  # from a log pane: on a node row `c` cordons the node
        lines = node1.lines_text()
        assert "r0: using device cuda:0, world size 8" in lines
        assert "r1: using device cuda:0, world size 8" in lines
        assert not any(line.startswith("ranks ") for line in lines)


async def test_scrolling_up_past_memory_fetches_older_lines_from_the_node(tmp_path):
    t0 = time.time()
    hosts = host_names(4)
    script = standard_script(hosts, t0=t0)
    script.lines("node1", 0, ["early line %d" % i for i in range(400)], t0 + 30)
    script.steps(41, 45)
    app, ctl, t = build(tmp_path, script)
    ctl.state.lines_per_rank = 30  # memory keeps 30 lines a rank: the rest is on the node
    every = "".join(rec[1] for _end, recs in t.node("node1").journal for rec in recs
                    if rec[0].get("k") == "data" and rec[0]["f"] == 0).split("\n")[:-1]
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        pane = app.logs.panes[0]
        assert pane.source == (RANK, 0)
        await wait_until(pilot, lambda: pane.view.lines_text() == every[-30:], what="rank 0's tail")
        await pilot.press("1")
        for _ in range(40):  # up to the top: pauses, and asks for nothing yet
            await pilot.press("up")
            await pilot.pause()
            if pane.view.scroll_y == 0:
                break
        assert pane.view.scroll_y == 0 and not pane.view.follow
        assert not [r for r in t.requests if r.op == "scrollback"]
        await pilot.press("up")  # up at the top: asks the node for what came before
        title = pane.query_one(".logpane--title")
        await wait_until(pilot, lambda: "start of log" in str(title.render()), what="older lines")
        assert pane.view.lines_text() == every  # every line once, in order
        await pilot.pause()
        # the lines on screen did not jump: the old top line is still the top row
        assert "".join(seg.text for seg in pane.view.render_line(0)).startswith(every[-30])
        await pilot.press("home")
        await wait_until(pilot, lambda: "".join(seg.text for seg in pane.view.render_line(0))
                         .startswith(every[0] + " "), what="home shows the first line")
        asked = [r for r in t.requests if r.op == "scrollback"]
        assert asked and all(r.node == "node1" and r.args["files"] == [0] for r in asked)
        assert not pane.view.follow
        await pilot.press("end")  # following again: back to what memory holds
        await pilot.pause()
        assert pane.view.follow and pane.view.lines_text() == every[-30:]


async def test_attach_takes_recent_lines_and_scrolls_back_for_the_rest(tmp_path):
    """Attaching to a long run reads only the newest lines (metrics and events all); the
    older lines come from the node when scrolled to."""
    t0 = time.time()
    hosts = host_names(4)
    script = standard_script(hosts, t0=t0)
    for chunk in range(40):
        script.lines("node1", 0, ["old line %d" % (100 * chunk + i) for i in range(100)],
                     t0 + 30)
    script.steps(41, 45)
    t = script.transport()
    ctl, _launch = controller(str(tmp_path), t)
    ctl.record = {"run_id": ctl.run_id}
    await ctl.connect_all()
    await ctl.recent_lines_only(keep=20_000)
    every = "".join(rec[1] for _end, recs in t.node("node1").journal for rec in recs
                    if rec[0].get("k") == "data" and rec[0]["f"] == 0).split("\n")[:-1]
    app = RankdeckApp(ctl, ctl.subscribe_all)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.logs.panes[0]
        await wait_until(pilot, lambda: (ctl.state.ranks.get(0) and ctl.state.ranks[0].step) == 45,
                         what="caught up")
        await wait_until(pilot, lambda: pane.view.lines_text()[-1:] == every[-1:],
                         what="the recent lines on screen")
        got = pane.view.lines_text()
        assert got == every[-len(got):] and 100 < len(got) < 2000  # the recent ones only
        assert [s for s, _loss in ctl.state.ranks[0].points][:3] == [1, 2, 3]  # every metric
        await pilot.press("1", "home")
        title = pane.query_one(".logpane--title")
        for _ in range(20):
            await wait_until(pilot, lambda: not pane._fetching, what="a page")
            if "start of log" in str(title.render()):
                break
            await pilot.press("home")
        assert pane.view.lines_text() == every


def burst(app, keys) -> None:
    """Keys as a terminal delivers them in one read (fast typing, a paste, tmux send-keys):
    all queued before the app handles the first."""
    from textual import events

    for key, char in keys:
        event = events.Key(key, char)
        event.set_sender(app)
        app._driver.send_message(event)


async def test_keys_typed_at_once_go_where_the_first_key_sends_them(tmp_path):
    """``1`` then ``Home`` in one burst: Home reaches pane 1, not the widget that had the
    focus before; ``/step`` in one burst: the prompt gets the whole pattern."""
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        assert app.focused is app.nodes
        burst(app, [("1", "1"), ("home", None)])
        pane = app.logs.panes[0]
        await wait_until(pilot, lambda: app.focused is pane.view, what="pane 1 focused")
        await wait_until(pilot, lambda: not pane.view.follow, what="home in pane 1")
        burst(app, [("slash", "/")] + [(c, c) for c in "step"])
        await wait_until(pilot, lambda: app.prompt.value == "step",
                         what="the whole pattern in the prompt")


async def test_follow_pause_wrap_and_timestamps(tmp_path):
    t0 = time.time()
    app, ctl, t = build(tmp_path, standard_script(host_names(4), t0=t0))
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        pane = app.logs.panes[0]
        await pilot.press("1", "f")
        assert not pane.view.follow
        assert "PAUSED" in str(pane.query_one(".logpane--title").render())
        y = pane.view.scroll_y
        live = RunScript(host_names(4), 2, t0=t0)
        live.lines("node1", 0, ["a long line " + "x" * 300] + ["more %d" % i for i in range(200)],
                   t0 + 30)
        t.node("node1").append(live.recs["node1"])
        await wait_until(pilot, lambda: pane.view.lines_text()[-1] == "more 199")
        assert pane.view.scroll_y == y  # paused: new lines do not move the view
        await pilot.press("t")
        last_step = pane.view.lines_text()[-202]
        assert last_step == time.strftime("%H:%M:%S ", time.localtime(t0 + 22)) + \
            "step 24 loss=1.3999 lr=3.00e-04 step_time=0.500s tok/s=32768"
        rows_before = pane.view.line_count
        await pilot.press("W")
        assert pane.view.line_count > rows_before  # long lines take several rows
        await pilot.press("end")
        assert pane.view.follow


async def test_untrusted_log_text_is_plain_and_keeps_the_layout(tmp_path):
    nasty = ["[rank0]: hello", "[bold]x[/]", "\x1b[31mred\x1b[0m text \x1b]0;title\x07",
             "bell\x07 nul\x00 back\x08 del\x7f", "bad \udcff\udcfe byte", "wide 漢字 ok",
             "tab\tstop\rprogress 100%", "[link=http://x]click[/link] :rocket:", "x" * 5000]
    script = standard_script(host_names(4), t0=time.time())
    script.lines("node1", 0, nasty, time.time())
    app, ctl, t = build(tmp_path, script)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        view = app.logs.panes[0].view
        await wait_until(pilot, lambda: view.lines_text()[-1].startswith("xxxx"))
        shown = view.lines_text()[-len(nasty):]
        assert shown == [clean(line) for line in nasty]
        assert shown[0] == "[rank0]: hello" and shown[1] == "[bold]x[/]"
        assert shown[7] == "[link=http://x]click[/link] :rocket:"
        assert all("\x1b" not in s and "\x00" not in s and "\udcff" not in s for s in shown)
        for wrap in (False, True):
            view.configure(wrap=wrap)
            await pilot.pause()
            width = view.scrollable_content_region.width
            for y in range(view.size.height):
                strip = view.render_line(y)
                assert sum(cell_len(seg.text) for seg in strip) == width
                text = "".join(seg.text for seg in strip)
                assert "\x1b" not in text and "\n" not in text
        # nothing was styled by markup in the text: only our own styles apply
        view.configure(wrap=False)
        view.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        bold = [seg for y in range(view.size.height) for seg in view.render_line(y)
                if seg.style and seg.style.bold and "x" == seg.text.strip()]
        assert not bold


# -- controls ----------------------------------------------------------------------------------
async def confirm(pilot, app, key: str, answer: str) -> None:
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirmation")
    await pilot.press(answer)
    await wait_until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))


async def test_kill_node_asks_then_stops_that_node(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        app.nodes.focus()
        app.nodes.move_to("r:3")  # a rank of node2
        await confirm(pilot, app, "k", "n")
        assert t.ops("stop") == []
        await confirm(pilot, app, "k", "escape")
        assert t.ops("stop") == []
        await confirm(pilot, app, "k", "y")
        await wait_until(pilot, lambda: t.ops("stop") == ["node2"], what="stop node2")
        await wait_until(pilot, lambda: node_row(app, "node2")[1] == "stopped")
        await wait_until(pilot, lambda: any(n.title == "stop node2" for n in app._notifications),
                         what="the stop's result")
        # the stop after "y" is done: one that "n" or Escape had started would be done too
        assert t.ops("stop") == ["node2"]
        assert node_row(app, "node1")[1] == "running"


async def test_kill_run_stops_every_node_and_the_store(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        await confirm(pilot, app, "K", "y")
        await wait_until(pilot, lambda: sorted(t.ops("stop")) == host_names(4), what="stop all")
        await wait_until(pilot, lambda: t.ops("store_stop") == ["node1"])
        await wait_until(pilot, lambda: ctl.state.run_state() == "stopped")
        assert ctl.exit_code() == 1


async def test_restart_node_and_run_send_restart(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        app.nodes.focus()
        app.nodes.move_to("n:node3")
        await confirm(pilot, app, "r", "y")
        await wait_until(pilot, lambda: t.ops("restart") == ["node3"], what="restart node3")
        args = [r.args for r in t.requests if r.op == "restart"][0]
        assert args["node"] == "node3" and args["spec"]["node"] == "node3"
        await confirm(pilot, app, "R", "n")
        assert t.ops("restart") == ["node3"]
        await confirm(pilot, app, "R", "y")
        await wait_until(pilot, lambda: len(t.ops("restart")) == 5, what="restart all")
        assert sorted(t.ops("restart")[1:]) == host_names(4)
        assert t.ops("stop") == []


# -- the rest of the screen ----------------------------------------------------------------------
async def test_gpu_panel_shows_gpus_ranks_and_no_gpu_reason(tmp_path):
    app, ctl, t = build(tmp_path, gpus={"node4": no_gpu_snapshot()})
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        await wait_until(pilot, lambda: any("no GPUs" in line for line in app.gpus.lines()))
        lines = app.gpus.lines()
        said = " ".join(" ".join(lines).split())  # the reason wraps at the panel's width
        assert "node4 no GPUs (pynvml: NVML Shared Library Not Found" in said
        node1 = lines[lines.index(next(x for x in lines if x.startswith("node1"))) + 1]
        assert "87%" in node1 and "41.0/80.0G" in node1 and "61°C" in node1
        assert "402/700W" in node1 and node1.endswith("r0")


def test_gpu_ranks_come_from_the_pids_nvml_sees():
    """Ranks are put on the GPU whose process list holds their worker's pid, whatever their
    local rank; without a match the local-rank guess is shown with a '?'."""
    from console.model.state import RunState
    from console.tui.gpu import node_gpu_lines

    state = RunState("r", [("n1", "10.0.0.1")])
    for lr, pid in ((0, 2001), (1, 2000)):  # local rank 0 was given GPU 1, and 1 GPU 0
        state.apply_records("n1", [[{"k": "file", "f": lr, "rank": lr, "local_rank": lr,
                                     "pid": pid, "stream": "stdout"}]], 10)
    snap = gpu_snapshot(2)
    for g, pid in zip(snap["gpus"], (2000, 2001)):
        g["pids"] = [pid]
    state.nodes["n1"].gpu = snap
    lines = node_gpu_lines(state, "n1", state.ranks_of("n1"))
    assert lines[1][-1][0] == "  r1" and lines[2][-1][0] == "  r0"
    for g in snap["gpus"]:
        g["pids"] = [999]  # pids of another PID namespace: guess by local rank, say so
    lines = node_gpu_lines(state, "n1", state.ranks_of("n1"))
    assert lines[1][-1][0] == "  r0?" and lines[2][-1][0] == "  r1?"


async def test_header_loss_chart_and_events(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        await wait_until(pilot, lambda: "ETA" in app.header.info().plain)
        header = app.header.info().plain
        assert "run %s" % RUN_ID in header
        assert "step 24/40" in header and "2.00 steps/s" in header and "ETA 0:00:08" in header
        assert len(app.chart.series()) == 1 and len(app.chart.series()[0]) == 24
        await pilot.press("l")
        assert app.chart.all_ranks and len(app.chart.series()) == 8
        assert "all ranks" in app.chart.render().plain
        await wait_until(pilot, lambda: any("ckpt 20" in s for s in app.events.shown))
        ckpt = next(s for s in app.events.shown if "ckpt 20" in s)
        assert "ckpt 20 … node1 700.0 MiB" in ckpt  # one node saved; not said complete yet
        await pilot.click(EventsLog)
        await pilot.press("enter")  # the path: in the events in full
        await wait_until(pilot, lambda: isinstance(app.screen, EventsScreen), what="screen")
        assert any("checkpoint step 20 saved: /ckpt/%s/step_20.pt (700.0 MiB)" % RUN_ID in s
                   for s in app.screen.lines)
        await pilot.press("escape")
        stamps = [s[:8] for s in app.query_one(EventsLog).shown]
        assert stamps == sorted(stamps)


async def test_eta_unknown_without_total_steps(tmp_path):
    app, ctl, t = build(tmp_path, steps=None)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        header = app.header.info().plain
        assert "step 24/?" in header and "ETA ?" in header


def help_rows(screen: HelpScreen) -> dict[str, set[str]]:
    """What the help screen shows: description -> the keys on its lines."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(screen.query_one("#help-keys", Static).content)  # the table it draws
    rows: dict[str, set[str]] = {}
    for line in console.export_text().splitlines():
        keys, _gap, description = line.strip().partition("  ")
        if description.strip():
            rows.setdefault(description.strip(), set()).update(keys.split(" / "))
    return rows


async def test_help_shows_every_key_of_every_widget(tmp_path):
    """Each widget that can have the focus is focused in turn; every key Textual then
    offers (its, its parents', the screen's, the app's) has its line in the help screen."""
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        main = app.screen
        active: dict[tuple, type] = {}
        focusable = [w for w in main.walk_children() if w.can_focus]
        assert {type(w).__name__ for w in focusable} >= {"NodesTable", "LogView", "EventsLog",
                                                         "PromptBar"}
        for widget in focusable:
            if widget is app.prompt:
                app.prompt.open("goto")  # shown only while typing
            main.set_focus(widget)
            await pilot.pause()
            assert app.focused is widget
            for key, held in app.active_bindings.items():
                if not held.binding.system:
                    label = held.binding.key_display or key
                    active[(label, held.binding.description)] = type(held.node)
            if widget is app.prompt:
                app.prompt.close()
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        rows = help_rows(app.screen)
        missing = [(key, description, node.__name__) for (key, description), node
                   in active.items() if key not in rows.get(description, ())]
        assert not missing, missing
        # a sample of what a user looks for, said the way the widgets say it
        assert "d" not in rows.get("Detach", ()) and "q" in rows["Detach"]
        assert "ctrl+p" in rows["palette"]
        assert "home" in rows["The start of the log (fetched from the hosts)"]
        assert "esc" not in rows and "escape" in rows["Close"] and "y" in rows["Yes"]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_palette_has_rankdeck_commands(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await running(pilot, app)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Kill run", "Restart run", "Kill node node2", "Restart node node4",
                      "Show rank 7", "Show node node3 merged", "Toggle wrap", "Keys"):
            assert title in titles
        show = next(c for c in app.get_system_commands(app.screen) if c.title == "Show rank 6")
        show.callback()
        assert app.logs.active_pane.source == (RANK, 6)
        await pilot.press("ctrl+p", *"g1/")  # the focus keys are text in the palette
        from textual.command import CommandInput
        assert app.screen.query_one(CommandInput).value == "g1/"
        assert app.logs.active == 0 and not app.prompt.has_class("-shown")


async def test_quit_detaches_and_tells_how_to_attach(tmp_path, capsys):
    script = standard_script(host_names(4), t0=time.time())
    t = script.transport()
    ctl, launch = controller(str(tmp_path), t)

    async def pilot_script(pilot):
        app = pilot.app
        await running(pilot, app)
        await pilot.press("q")

    async with ctl:  # as the verbs hold it: leaving the block closes the links
        code = await run_app(ctl, launch, headless=True, size=SIZE, auto_pilot=pilot_script)
    assert code == 0
    assert "rankdeck attach %s" % RUN_ID in capsys.readouterr().err
    assert t.ops("stop") == [] and t.ops("restart") == []
    assert all(link.stream is None for link in ctl.links.values())  # closed, run untouched


async def test_run_app_exit_code_when_the_run_ended(tmp_path):
    script = standard_script(host_names(2), t0=time.time())
    for node in host_names(2):
        script.recs[node].append([event("ended", T0, state="exited", exit_code=0)])
    t = script.transport()
    ctl, launch = controller(str(tmp_path), t, hosts=2)
    ctl_app = RankdeckApp(ctl, launch, exit_on_done=True)
    async with ctl_app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: ctl.state.run_state() == "succeeded")
        await wait_until(pilot, lambda: not ctl_app.is_running)
    assert ctl.exit_code() == 0 and ctl_app.return_value == 0


async def test_run_app_reports_a_failed_launch_after_the_screen_is_gone(tmp_path, capsys):
    script = standard_script(host_names(4), t0=time.time())
    t = script.transport(unreachable={"node2": ("dns", "node2: name does not resolve")})
    ctl, launch = controller(str(tmp_path), t)

    async def pilot_script(pilot):
        await wait_until(pilot, lambda: not pilot.app.launching, what="launch to fail")
        await pilot.press("q")

    code = await run_app(ctl, launch, headless=True, size=SIZE, auto_pilot=pilot_script)
    assert code == 3
    err = capsys.readouterr().err
    assert "launch failed" in err and "node2" in err and "rankdeck attach" not in err


async def test_log_view_keeps_at_most_max_lines_wrapped_or_not():
    from textual.app import App

    from console.lines.lines import Entry
    from console.tui.logview import LogView

    class One(App):
        def compose(self):
            yield LogView(max_lines=50, multi_rank=True)

    app = One()
    async with app.run_test(size=(40, 10)) as pilot:
        view = app.query_one(LogView)
        for wrap in (False, True):
            view.configure(wrap=wrap, collapse=True)
            view.set_entries([])
            for batch in range(5):
                view.add_entries([Entry(None, "n1", r, "line %d of batch %d %s"
                                        % (i, batch, "x" * i), None, i)
                                  for i in range(30) for r in (0, 1)])
                await pilot.pause()
                assert len(view.lines_text()) == min(50, 30 * (batch + 1))
                assert view.lines_text()[-1].startswith("ranks 0-1: line 29 of batch %d" % batch)
                if wrap:
                    assert len(view._rows) == sum(line.nrows for line in view._lines)
                    assert view.line_count > len(view.lines_text())


async def test_zoom_gives_the_panes_the_width_and_long_lines_scroll_sideways(tmp_path):
    app, ctl, t = build(tmp_path)
    async with app.run_test(size=(120, 35)) as pilot:
        await running(pilot, app)
        view = app.logs.panes[0].view
        narrow = view.size.width
        # a rank's whole step line fits at 120x35 (the panes stack): "step 24 ... tok/s=32768"
        assert len(view.lines_text()[-1]) < narrow
        live = RunScript(host_names(4), 2, t0=time.time())
        live.lines("node1", 0, ["a long line " + "x" * 200], time.time())
        t.node("node1").append(live.recs["node1"])
        await wait_until(pilot, lambda: view.lines_text()[-1].startswith("a long line"),
                         what="the long line")
        assert narrow < len(view.lines_text()[-1])  # cut: it scrolls sideways
        await pilot.press("1", "right", "right")
        assert view.scroll_x == 2
        await pilot.press("z")
        await wait_until(pilot, lambda: not app.side.display and view.size.width >= narrow + 15,
                         what="the panes zoomed")
        await pilot.press("z")
        await wait_until(pilot, lambda: app.side.display and view.size.width == narrow,
                         what="the side panel back")
