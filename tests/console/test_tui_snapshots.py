"""SVG snapshots of the rankdeck TUI (pytest-textual-snapshot; Textual pinned in pyproject).

Deterministic: the scripted run has fixed timestamps, the header's clock is frozen, RunState's
and RunController's ``time.time`` are frozen (events and launch time, in the console/state*
and console/run* modules that read it), and the time zone is UTC. Review a changed SVG
before accepting it with ``--snapshot-update``.
"""

from __future__ import annotations

import time

import pytest
from rich.cells import cell_len

import console.judgement.local_judge
import console.run.preflight
import console.run.attach
import console.run.control
import console.run.housekeeping
import console.run.launch
import console.model.state
import console.model.ranks
from console.model.sources import RANK
from console.tui.app import RankdeckApp
from console.tui.help import HelpScreen
from console.tui.rowsview import line_width
from tests.console.scripted import (RUN_ID, T0, controller, host_names, host_sample,
                                    no_gpu_snapshot, standard_script)
from tests.console.settle import screen_text, settled
from tests.console.test_tui_scale import HOSTS, NPROC, big_run
from tests.waits import wait_until

SIZE = (160, 48)
SIZES = [(120, 35), (160, 48), (200, 60)]
NOW = T0 + 40  # the moment every event of the script has happened
CLOCK = NOW + 754  # what the header shows as elapsed: 0:12:34


class FrozenTime:
    """The ``time`` module with ``time()`` stopped at one instant."""

    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture(autouse=True)
def frozen(monkeypatch, tmp_path):
    for module in (console.model.state, console.model.ranks, console.judgement.local_judge, console.run.launch,
                   console.run.attach, console.run.control, console.run.housekeeping,
                   console.run.preflight):
        monkeypatch.setattr(module, "time", FrozenTime(NOW))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    time.tzset()
    yield
    time.tzset()


def make_app(tmp_path, script, hosts: int = 4, slots: int = 2,
             samples: dict | None = None) -> RankdeckApp:
    transport = script.transport(gpus={"node4": no_gpu_snapshot()}, hosts=samples)
    ctl, launch = controller(str(tmp_path), transport, hosts=hosts, slots=slots)
    return RankdeckApp(ctl, launch, clock=lambda: CLOCK)


def saved_everywhere():
    """The standard run (3 nodes of 2 H100s in the tests' NVML snapshots, one without GPUs)
    with every node saving step 20 and finding its save complete, and host samples."""
    hosts = host_names(4)
    script = standard_script(hosts)
    for i, node in enumerate(hosts):
        path = "/ckpt/%s/step_20.pt" % RUN_ID if i == 0 else "/ckpt/%s/%s/step_20.pt" % (
            RUN_ID, node)
        if i:
            script.ckpt(node, 20, path, 734003200, T0 + 21)
        script.ckpt_done(node, 20, path, 734003200, 2.5 + 0.3 * i, T0 + 23)
    return script, {node: host_sample() for node in hosts}


async def reads_whole(pilot):
    """Settled, and the screen reads whole: a rank's step line, every GPU figure with its
    unit, the host line's figures, one line for the four nodes' saves of step 20."""
    await settled(pilot)
    text = screen_text(pilot.app)
    assert "step 24 loss=1.3999 lr=3.00e-04 step_time=0.500s tok/s=32768" in text
    gpus = pilot.app.gpus
    lines = gpus.lines()  # all of the panel's lines, those scrolled out of sight too
    assert all(cell_len(line) <= gpus.line_width for line in lines)  # none is cut
    assert sum("87%  41.0/80.0G  61°C  402/700W" in line for line in lines) == 3
    assert sum("cpu 63%  mem 412.3/2015.6G" in line for line in lines) == 4
    assert "402/700W" in text and text.count("/700") == text.count("/700W")
    assert text.count("ckpt 20 ✓ 4 nodes") == 1  # cut with "…" where the pane is narrow
    assert sum(line.endswith("ckpt 20 ✓ 4 nodes × 700.0 MiB 3.4 s")
               for line in pilot.app.events.shown) == 1
    assert "checkpoint" not in text and "preflight preflight" not in text
    assert "rank 7 @node4" in text  # pane 2: the last rank
    nodes = pilot.app.nodes  # every row fits the table: its telemetry whole or left out
    room = nodes.scrollable_content_region.width
    assert all(line_width(line) <= room for key in nodes._keys for line in nodes.lines_of(key))
    for node in ("node1", "node4"):  # its last figure has its unit: whole, not cut
        assert nodes.row_text("n:" + node)[0].rstrip()[-1] in "%Gs", node


@pytest.mark.parametrize("size", SIZES, ids=["%dx%d" % size for size in SIZES])
def test_main_screen(snap_compare, tmp_path, size):
    script, samples = saved_everywhere()
    app = make_app(tmp_path, script, samples=samples)
    assert snap_compare(app, terminal_size=size, run_before=reads_whole)


def test_nodes_folded_at_512_ranks(snap_compare, tmp_path):
    """64 nodes x 8 ranks: a row per node; rank 100 behind, rank 300 the slowest."""
    app = make_app(tmp_path, big_run(T0), hosts=HOSTS, slots=NPROC)
    assert snap_compare(app, terminal_size=SIZE, run_before=settled)


def test_help_screen(snap_compare, tmp_path):
    app = make_app(tmp_path, standard_script(host_names(4)))

    async def open_help(pilot):
        await settled(pilot)
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen), what="help")
        await pilot.pause()  # painted

    assert snap_compare(app, terminal_size=SIZE, run_before=open_help)


def test_crashed_node(snap_compare, tmp_path):
    script = standard_script(host_names(4))
    script.crash("node2", 1, 1, "CUDA error: an illegal memory access was encountered",
                 T0 + 30)

    async def show_crash(pilot):
        await settled(pilot)
        app = pilot.app
        assert app.nodes.row_values("n:node2")[1] == "failed (1)"
        await pilot.press("2", "g", "3", "enter")  # the failed rank's log in pane 2
        await wait_until(pilot, lambda: app.logs.panes[1].source == (RANK, 3), what="rank 3")
        await settled(pilot)

    app = make_app(tmp_path, script)
    assert snap_compare(app, terminal_size=SIZE, run_before=show_crash)
