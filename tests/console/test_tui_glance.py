"""What makes the view read at a glance (issue 30): lines that fit without cutting a figure,
events said once and checkpoint saves folded, the latest alert pinned, a step axis."""

from __future__ import annotations

from rich.cells import cell_len

from console.model.state import RunState
from console.model.nodes import Event
from console.tui.eventlines import event_text, folded, item_text, pinned_text
from console.tui.fitting import fitted, wrapped
from console.tui.gpu import node_gpu_lines, same_reasons
from console.tui.losschart import step_axis
from tests.console.scripted import gpu_snapshot, host_sample, no_gpu_snapshot


def plain(line: tuple) -> str:
    return "".join(text for text, _style in line)


def test_fitted_leaves_out_the_least_needed_pieces_whole():
    pieces = [("a", "", 0), (" bbbb", "", 2), (" cc", "", 1), (" dddd", "", 2)]
    assert plain(fitted(pieces, 100)) == "a bbbb cc dddd"
    assert plain(fitted(pieces, 10)) == "a bbbb cc"  # the last of the least needed first
    assert plain(fitted(pieces, 4)) == "a cc"
    assert plain(fitted(pieces, 0)) == "a"  # what must stay stays


def test_wrapped_breaks_between_pieces_and_words_never_inside_a_figure():
    line = (("cpu 63%", ""), ("  mem 412.3/2015.6G", ""), ("  load 38.2", ""))
    assert [plain(x) for x in wrapped(line, 30)] == ["cpu 63%  mem 412.3/2015.6G",
                                                     "  load 38.2"]
    long = (("node4", "b"), ("  no GPUs (pynvml: NVML Shared Library Not Found)", ""))
    lines = [plain(x) for x in wrapped(long, 24, "    ")]
    assert all(cell_len(x) <= 24 for x in lines)
    assert " ".join(" ".join(lines).split()) == "node4 no GPUs (pynvml: NVML Shared Library " \
        "Not Found)"


def gpu_state(snap: dict, sample: dict | None = None) -> RunState:
    state = RunState("r", [("node1", "10.0.0.1"), ("node2", "10.0.0.2")])
    for node in ("node1", "node2"):
        state.apply_telemetry(node, snap, sample)
    return state


def test_a_gpu_line_keeps_every_figure_whole_with_its_unit_at_any_width():
    snap = gpu_snapshot(2)
    snap["gpus"][0].update(sm_clock=1980, power=477.0)
    state = gpu_state(snap, host_sample())
    wide = [plain(x) for x in node_gpu_lines(state, "node1", [], 200)]
    assert wide[-2] == " 0 ███████·  87%  41.0/80.0G  61°C  477/700W  1980MHz"
    for width in (60, 44, 37, 30, 24):
        lines = [plain(x) for x in node_gpu_lines(state, "node1", [], width)]
        assert all(cell_len(x) <= width for x in lines), (width, lines)
        gpu0 = lines[-2]
        assert "87%" in gpu0 and "41.0/80.0G" in gpu0  # never left out
        assert "477/700W" in gpu0 or "/70" not in gpu0  # whole, or not there at all
        text = " ".join(lines)
        assert "cpu 63%" in text and "net 1.2↓ 0.9↑ Gb/s" in text  # wrapped, not cut
    assert "477/700W" in [plain(x) for x in node_gpu_lines(state, "node1", [], 37)][-2]


def test_no_gpu_reason_is_said_once_for_the_nodes_that_share_it():
    state = gpu_state(no_gpu_snapshot())
    assert same_reasons(state) == {"node2": "node1"}
    first = [plain(x) for x in node_gpu_lines(state, "node1", [], 40)]
    assert "nvidia-smi: not found)" in " ".join(" ".join(first).split())
    assert [plain(x) for x in node_gpu_lines(state, "node2", [], 40, "node1")] == [
        "node2  no GPUs (as node1)"]


def ev(kind: str, text: str, node: str | None = "node1", rank: int | None = None,
       ts: float = 1000.0) -> Event:
    return Event(ts, node, kind, text, rank)


def test_an_event_says_its_kind_once():
    assert event_text(ev("preflight", "preflight ok (torch 2.13.0, 2 GPU(s))")).plain \
        .endswith("node1 preflight ok (torch 2.13.0, 2 GPU(s))")
    assert event_text(ev("rendezvous", "rendezvous store at 10.0.0.1:29400")).plain \
        .endswith("node1 rendezvous store at 10.0.0.1:29400")
    assert event_text(ev("stalled", "rank 3 stalled: no step for 60 s", rank=3)).plain \
        .endswith("node1/r3 rank 3 stalled: no step for 60 s")
    assert event_text(ev("launched", "torchrun started (pid 7)")).plain \
        .endswith("node1 launched torchrun started (pid 7)")


def test_every_nodes_save_of_a_step_is_one_line_and_an_incomplete_one_an_alert():
    state = RunState("r", [("node%d" % i, "h") for i in range(1, 4)])
    events = []
    for i in range(1, 4):
        events.append(ev("checkpoint", "checkpoint step 800 saved: /c/node%d/s800 (1.1 GiB)" % i,
                         "node%d" % i, ts=1000.0 + i))
    events.append(ev("launched", "torchrun started", "node1", ts=1001.5))
    for i in range(1, 3):
        events.append(ev("checkpoint complete", "checkpoint step 800 complete: 1.1 GiB in "
                         "4.2 s", "node%d" % i, ts=1005.0 + i))
    items = folded(events)
    assert [step for step, _evs in items] == ["800", None]  # where its first save was
    line = item_text(items[0], state).plain
    assert "ckpt 800 … 3 nodes" in line  # node3 has not said its save is complete
    events.append(ev("checkpoint incomplete", "checkpoint step 800 incomplete: /c/node3/s800 "
                     "lacks optimizer.pt", "node3", ts=1009.0))
    line = item_text(folded(events)[0], state).plain
    assert "ckpt 800 ✗ 3 nodes" in line and "incomplete on node3" in line
    assert "/c/node" not in line  # paths: in the events screen
    for i in range(1, 4):  # the trainer prunes it later: a line of its own, when it happens
        events.append(ev("checkpoint deleted", "checkpoint step 800 deleted by the trainer: "
                         "/c/node%d/s800" % i, "node%d" % i, ts=1100.0 + i))
    items = folded(events)
    assert [step for step, _evs in items] == ["800", None, "800 deleted"]
    assert item_text(items[-1], state).plain.endswith("ckpt 800 deleted on 3 nodes")


def test_the_latest_alert_is_pinned_with_how_many_came_before():
    alerts = [ev("stalled", "rank 3 stalled: no step for 60 s", rank=3),
              ev("failed", "rank 3 (local 1) exited with code 1", "node2", 3, ts=1010.0)]
    assert pinned_text([]) is None
    pinned = pinned_text(alerts).plain
    assert pinned.startswith("⚠ ") and "node2/r3 failed rank 3" in pinned
    assert pinned.endswith("(+1 before)")


def test_the_step_axis_labels_its_ends_and_evenly_between_each_step_once():
    assert step_axis(1, 24, 30) == "1      7      12      18    24"
    assert step_axis(1, 3, 30) == "1             2              3"
    assert step_axis(0, 1, 8) == "0      1"
    assert len(step_axis(1, 123456, 20)) == 20


async def test_a_crash_stays_pinned_under_the_events_while_saves_come_in(tmp_path):
    import time

    from tests.console.scripted import RUN_ID, RunScript, host_names, standard_script
    from tests.console.test_tui import build, running
    from tests.waits import wait_until

    t0 = time.time()
    script = standard_script(host_names(4), t0=t0)
    script.crash("node2", 1, 1, "CUDA error: an illegal memory access", t0 + 25)
    app, ctl, t = build(tmp_path, script)
    async with app.run_test(size=(120, 35)) as pilot:
        await running(pilot, app)
        events = app.events
        await wait_until(pilot, lambda: "node2/r3 failed" in events.pinned, what="pinned")
        later = RunScript(host_names(4), 2, t0=t0)
        for i, node in enumerate(host_names(4)):
            path = "/ckpt/%s/%s/step_30.pt" % (RUN_ID, node)
            later.ckpt(node, 30, path, 2 ** 30, t0 + 40 + i)
            later.ckpt_done(node, 30, path, 2 ** 30, 4.2, t0 + 45 + i)
            t.node(node).append(later.recs[node])
        await wait_until(pilot, lambda: any("ckpt 30 ✓ 4 nodes × 1.0 GiB 4.2 s" in line
                                            for line in events.shown), what="the folded save")
        assert sum("ckpt 30" in line for line in events.shown) == 1
        assert "node2/r3 failed" in events.pinned  # a newer save does not bury it
        pinned = str(events.border_subtitle)  # what the pane's lower border shows
        assert pinned.count("⚠") == 1 and "node2/r3" in pinned and "failed (exit 1)" in pinned


async def test_a_steps_line_is_written_again_from_where_it_changed_not_the_whole_pane():
    """A save's events come in node by node: the pane rewrites the lines from the step's
    on (they read as the events say), the lines before stay as drawn."""
    from textual.app import App

    from console.tui.events import EventsLog
    from tests.waits import wait_until

    state = RunState("r", [("node%d" % i, "h") for i in range(1, 4)])

    class One(App):
        def compose(self):
            yield EventsLog(state, id="events")

    app = One()
    async with app.run_test(size=(100, 20)) as pilot:
        log = app.query_one(EventsLog)
        for i in range(5):
            log.add(ev("launched", "torchrun started (pid %d)" % i, ts=1000.0 + i))
        log.add(ev("checkpoint", "checkpoint step 10 saved: /c/n1 (1.0 GiB)", "node1", ts=1010))
        log.add(ev("launched", "torchrun started (pid 9)", ts=1011.0))

        def drawn() -> list[str]:
            return [strip.text.rstrip() for strip in log.lines]
        await wait_until(pilot, lambda: len(drawn()) == 7, what="7 lines")
        first = list(log.lines[:5])
        for i in (2, 3):
            log.add(ev("checkpoint", "checkpoint step 10 saved: /c/n%d (1.0 GiB)" % i,
                       "node%d" % i, ts=1010.0 + i / 10))
        await wait_until(pilot, lambda: "3 nodes" in " ".join(drawn()), what="folded")
        assert drawn() == log.shown and len(drawn()) == 7
        assert "ckpt 10 … 3 nodes" in drawn()[5] and "pid 9" in drawn()[6]
        assert all(a is b for a, b in zip(first, log.lines[:5]))  # not drawn again


async def test_a_node_slurm_drains_says_so_first_in_its_row_at_120x35(tmp_path):
    """A Slurm run's node that Slurm has drained (console/run/attach.py follows sinfo): its row in
    the nodes table says so in Slurm's short word before its telemetry (the full words,
    with the reason, are in `status`)."""
    import time

    from tests.console.scripted import host_names, standard_script
    from tests.console.settle import screen_text, settled
    from tests.console.test_tui import build, running
    from tests.waits import wait_until

    script = standard_script(host_names(4), t0=time.time())
    app, ctl, _t = build(tmp_path, script)
    async with app.run_test(size=(120, 35)) as pilot:
        await running(pilot, app)
        await settled(pilot)
        assert "drain" not in screen_text(app)
        ctl.state.set_slurm({"job": "7", "state": "RUNNING", "reason": "", "time_left_s": 600,
                             "at": time.time(), "nodes": {"node2": "draining (disk full)"}})
        # at 120x35 the detail column has 7 cells: Slurm's own short word, before telemetry
        rows = lambda: [line for line in screen_text(app).splitlines()  # noqa: E731
                        if "node2" in line and "drain" in line]
        await wait_until(pilot, rows, what=lambda: screen_text(app))
        assert not [line for line in screen_text(app).splitlines()
                    if "node1" in line and "drain" in line]
        await pilot.resize_terminal(240, 40)  # room for telemetry too: Slurm's word first
        await wait_until(pilot, lambda: [line for line in rows() if "gpu" in line],
                         what=lambda: screen_text(app))
        (row,) = rows()
        assert row.index("drain") < row.index("gpu"), row
