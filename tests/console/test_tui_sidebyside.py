"""The log panes side by side where whole lines fit next to each other, aligned by step
there, stacked where they do not fit (console/tui/align.py); the footer shows whole keys
only; no horizontal scrollbar under lines that fit. A real RankdeckApp over the scripted
transport (tests/console/scripted.py)."""

from __future__ import annotations

import time

import pytest

from console.tui.app import RankdeckApp
from tests.console.scripted import RunScript, controller, host_names, standard_script
from tests.console.settle import screen_text, settled
from tests.waits import wait_until


@pytest.fixture(autouse=True)
def _utc(own_home, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    time.tzset()


def build(tmp_path, script: RunScript | None = None) -> RankdeckApp:
    script = script or standard_script(host_names(4), t0=time.time())
    ctl, launch = controller(str(tmp_path), script.transport(), steps=40)
    return RankdeckApp(ctl, launch)


def beside(app) -> bool:
    """Every pane next to the one before it: on the same rows, to its right."""
    regions = [p.region for p in app.logs.panes]
    return all(b.y == a.y and b.x >= a.right for a, b in zip(regions, regions[1:]))


def stacked(app) -> bool:
    regions = [p.region for p in app.logs.panes]
    return all(b.x == a.x and b.y >= a.bottom for a, b in zip(regions, regions[1:]))


def whole_lines(app) -> None:
    """Every pane's lines fit its width, and no pane has a horizontal scrollbar."""
    for pane in app.logs.panes:
        view = pane.view
        room = view.scrollable_content_region.width
        assert room >= max(len(t) for t in view.lines_text()), pane.region
        assert not view.show_horizontal_scrollbar, pane.region


async def zoom(pilot) -> None:
    """``z``: the side panels hidden (or shown again)."""
    shown = pilot.app.side.display
    await pilot.press("z")
    await wait_until(pilot, lambda: pilot.app.side.display != shown, what="z done")
    await pilot.pause()
    await pilot.pause()


async def test_two_panes_side_by_side_at_160_with_z(tmp_path):
    app = build(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await settled(pilot)
        assert stacked(app)  # beside the nodes and GPUs: 116 columns, no room for two
        whole_lines(app)
        await zoom(pilot)
        await wait_until(pilot, lambda: beside(app), what="two panes side by side")
        assert [p.region.width for p in app.logs.panes] == [80, 80]
        whole_lines(app)
        await zoom(pilot)  # the side panels back: stacked again
        await wait_until(pilot, lambda: stacked(app), what="stacked again")


async def test_three_panes_side_by_side_at_240(tmp_path):
    app = build(tmp_path)
    async with app.run_test(size=(240, 60)) as pilot:
        await settled(pilot)
        await zoom(pilot)
        await pilot.press("plus")
        await wait_until(pilot, lambda: len(app.logs.panes) == 3, what="a third pane")
        await settled(pilot)
        await wait_until(pilot, lambda: beside(app), what="three panes side by side")
        whole_lines(app)
        await pilot.press("plus")  # four of 60 columns: a 62-column line does not fit
        await wait_until(pilot, lambda: len(app.logs.panes) == 4, what="a fourth pane")
        await wait_until(pilot, lambda: stacked(app), what="four panes stacked")


async def test_stacked_at_120(tmp_path):
    app = build(tmp_path)
    async with app.run_test(size=(120, 35)) as pilot:
        await settled(pilot)
        assert stacked(app)
        whole_lines(app)
        await zoom(pilot)
        assert stacked(app)  # two panes of 60 columns: the step lines would be cut
        whole_lines(app)


def footer_keys(app) -> list:
    return [w for w in app.query("SteadyFooter > *")]


@pytest.mark.parametrize("size", [(120, 35), (160, 48)])
async def test_footer_shows_whole_keys(tmp_path, size):
    app = build(tmp_path)
    async with app.run_test(size=size) as pilot:
        await settled(pilot)
        keys = footer_keys(app)
        palette = [k for k in keys if k.has_class("-command-palette")]
        assert palette and len(keys) > 4
        edge = palette[0].region.x
        for key in keys:
            if key not in palette:  # each whole, left of the palette key
                assert key.region.right <= edge, (key.description, key.region, edge)
                assert key.region.width == len(key.key_display) + len(key.description) + 3
        line = screen_text(app).rstrip("\n").split("\n")[-1]
        rest = line
        for key in keys:  # the footer's row is its keys, whole, and blanks
            whole = "%s %s" % (key.key_display, key.description)
            assert whole in rest, (whole, line)
            rest = rest.replace(whole, "", 1)
        assert set(rest) <= {" ", "▏"}, line


def uneven_script(steps: int = 60) -> RunScript:
    """Every rank steps together; rank 0 also prints an eval line after every third step, so
    its pane has more lines per step than the last rank's."""
    t0 = time.time()
    script = RunScript(host_names(4), 2, t0).launched()
    for step in range(1, steps + 1):
        t = t0 + 10 + step * 0.5
        for node in script.hosts:
            for lr in range(2):
                rank = script.rank(node, lr)
                lines = ["step %d loss=%.4f" % (step, 4.0 / step + 0.01 * rank)]
                if rank == 0 and step % 3 == 0:
                    lines.append("eval after step %d: accuracy 0.%02d" % (step, step))
                script.lines(node, lr, lines[:1], t)
                script.recs[node].append([{"k": "metric", "f": lr, "step": step,
                                           "loss": 4.0 / step, "ts": t}])
                if len(lines) > 1:
                    script.lines(node, lr, lines[1:], t)
    return script


def step_on_rows(view) -> dict:
    """{step: row on screen} of the step lines ``view`` shows."""
    top, height = round(view.scroll_y), view.scrollable_content_region.height
    rows = {}
    for row, text in enumerate(view.lines_text()[top:top + height]):
        if text.startswith("step "):
            rows[int(text.split()[1])] = row
    return rows


async def test_side_by_side_panes_scroll_together_by_step(tmp_path):
    app = build(tmp_path, uneven_script())
    async with app.run_test(size=(160, 48)) as pilot:
        await settled(pilot)
        await zoom(pilot)
        await wait_until(pilot, lambda: beside(app), what="side by side")
        first, second = (p.view for p in app.logs.panes)
        assert len(first.lines_text()) > len(second.lines_text())  # rank 0's eval lines
        await pilot.press("1", "pageup")  # a page back: 80 lines, 29 rows
        await wait_until(pilot, lambda: not first.follow and not second.follow
                         and 0 < first.scroll_y < first.max_scroll_y, what="both paused")
        await pilot.pause()
        await pilot.pause()
        mine, theirs = step_on_rows(first), step_on_rows(second)
        newest = max(mine)  # the newest step pane 1 shows is on the same row in pane 2
        assert theirs.get(newest) == mine[newest], (mine, theirs)
        await pilot.press("end")  # following again: both
        await wait_until(pilot, lambda: first.follow and second.follow, what="both follow")
