"""What a Pilot test of a scripted run waits for before it looks: everything shown, and what
the screen then shows as text."""

from __future__ import annotations

import io
import time

from rich.console import Console

from console.tui.losschart import REDRAW_S
from console.tui.messages import RunChanged
from tests.waits import wait_until


def _delivered(app) -> bool:
    """Every message the scripted agents sent has been read and every journal applied."""
    ctl, nodes = app.ctl, app.ctl.transport.nodes
    return all(node.stream.queue.empty() and ctl.state.nodes[name].journal_offset >= node.end
               for name, node in nodes.items() if node.subscribed and node.stream is not None)


def _quiet(app) -> bool:
    """Launched, all delivered, the feed holds nothing back and no pane is still refilling."""
    feed = app.feed
    return (not app.launching and _delivered(app) and feed._flush_handle is None
            and feed._change_handle is None and not any(p._filling for p in app.logs.panes))


async def settled(pilot, timeout: float = 60.0) -> None:
    """The run as the scripted agents sent it, all of it on screen: the app is quiet (see
    :func:`_quiet`), then a state refresh posted after that (and outside the loss chart's
    redraw throttle) has redrawn each widget a refresh redraws (the nodes table, GPU panel
    and loss chart come a few frames apart), and the frame is painted. Fails at its
    deadline."""
    app = pilot.app
    await wait_until(pilot, lambda: _quiet(app), timeout,
                     "the run launched, every scripted record applied and shown")
    # the loss chart redraws at most once a REDRAW_S: a refresh inside the window of a
    # redraw made before the last record came would leave that one on screen
    chart = app.chart
    await wait_until(pilot, lambda: time.monotonic() - chart._drawn >= REDRAW_S, timeout,
                     "the loss chart's redraw window")
    redrawn: set[str] = set()
    widgets = (("nodes", app.nodes, "refresh_rows"), ("gpus", app.gpus, "refresh_rows"),
               ("chart", app.chart, "update_chart"))
    for name, widget, method in widgets:
        real = getattr(widget, method)
        setattr(widget, method, lambda real=real, name=name: (redrawn.add(name), real())[1])
    try:
        app.post_message(RunChanged())
        await wait_until(pilot, lambda: len(redrawn) == len(widgets), timeout,
                         lambda: "a state refresh to redraw %s (done: %s)"
                         % ([w[0] for w in widgets], sorted(redrawn)))
    finally:
        for _name, widget, method in widgets:
            delattr(widget, method)  # the class's own method again
    await pilot.pause()  # the frame with all of it is painted


def screen_text(app) -> str:
    """The screen as plain text, drawn afresh the way a frame draws it (every widget's
    render runs, toasts included: text a frame could not draw fails here too)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True,
                      force_terminal=True, color_system="truecolor", legacy_windows=False)
    console.print(app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens))
    return console.export_text()
