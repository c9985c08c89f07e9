"""RankdeckApp: composes the console's widgets, binds keys and routes messages - no more.

``run_app(ctl, launch)`` is what ``rankdeck launch/demo/attach`` call: the app is up from the
first frame and, when ``launch`` is given, runs it as a worker so the nodes table shows each
host connecting, starting, meeting at the rendezvous and taking its first step. RunState's
callbacks reach the widgets through RunFeed (feed.py) as batched messages. Quitting detaches:
the run goes on. The app only shows the run: its caller owns the RunController (closing it,
leaving the run: ``RunController.leave``), and the exit code is the controller's.
"""

from __future__ import annotations

import gc
import re
import sys
import time
from typing import Awaitable, Callable, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen

from ..errors import LaunchError
from ..run.run import RunController
from ..lines.sanitize import clean
from ..model.sources import ALL, NODE, RANK
from ..model.state import RUN_ENDED
from ..model.summary import control_lines, detach_hint, status_table
from .confirm import control_confirm
from .cordon import open_cordon
from .events import EventsLog
from .feed import RunFeed
from .footer import SteadyFooter
from .frames import paint_now
from .gpu import GpuPanel
from .header import RunHeader
from .help import HelpScreen, key_sections
from .hosts import HostsScreen
from .lateness import open_lateness
from .logs import LogPanes
from .lru import tune_gc, untune_gc
from .losschart import LossChart
from .messages import (
    FilterChanged, FollowChanged, GotoSubmitted, LogLines, RunChanged, RunEventAdded,
    SourceChosen
)
from .nodes import NodesTable
from .palette import rankdeck_commands
from .prompt import PromptBar
from .readonly import changes_run, drop_changing_keys
from .screenshot import whole_spaces
from .stacks import open_stacks
from .verdict import open_verdict, verdict_arrived

# Their keys are priority bindings: the app acts on them when it receives them. Those that
# move the focus must (the keys typed after them go to the new focus); those that change what
# a pane shows save the key's trip to the focused widget and back, a frame or two at a flood.
PRIORITY_ACTIONS = ("filter", "goto", "focus_pane", "worst", "step", "cycle_source")
TURN_S = 0.05  # between the large widgets' redraws after a state change: a few frames


class RankdeckApp(App[int]):
    """The console for one run; ``ctl`` is a RunController (tests pass one built on a fake)."""

    CSS_PATH = "app.tcss"
    TITLE = "rankdeck"
    BINDINGS = [
        Binding("q", "detach", "Detach"),
        Binding("question_mark", "help", "Help", key_display="?"),
        # Keys that move the focus, or change what a pane shows, are priority bindings
        # (PRIORITY_ACTIONS): they act when the app receives them, before it hands the next
        # keys (typed fast, pasted) to the focused widget.
        Binding("slash", "filter", "Filter", key_display="/", priority=True),
        Binding("g", "goto", "Go to rank", priority=True),
        Binding("exclamation_mark", "worst", "Worst row", key_display="!", priority=True),
        Binding("z", "zoom", "Logs full width (hide nodes and GPUs)", show=False),
        Binding("left_square_bracket", "step(-1)", "Prev rank", key_display="[",
                priority=True),
        Binding("right_square_bracket", "step(1)", "Next rank", key_display="]",
                priority=True),
        Binding("n", "cycle_source", "Rank/node/all", priority=True),
        Binding("plus", "add_pane", "Add pane", key_display="+"),
        Binding("minus", "remove_pane", "Remove pane", key_display="-", show=False),
        Binding("1", "focus_pane(0)", "Pane 1", show=False, priority=True),
        Binding("2", "focus_pane(1)", "Pane 2", show=False, priority=True),
        Binding("3", "focus_pane(2)", "Pane 3", show=False, priority=True),
        Binding("4", "focus_pane(3)", "Pane 4", show=False, priority=True),
        Binding("f", "follow", "Follow/pause"),
        Binding("w", "why", "Who is stuck"),
        Binding("s", "stacks", "Stacks of the node"),
        Binding("L", "lateness", "Lateness of each rank, worst first", key_display="L",
                show=False),
        Binding("H", "hosts", "Hosts: load, GPU memory, strays, incidents", key_display="H",
                show=False),
        Binding("W", "toggle('wrap')", "Wrap", key_display="W", show=False),
        Binding("t", "toggle('timestamps')", "Timestamps", show=False),
        Binding("c", "toggle('collapse')", "Collapse identical", show=False),
        Binding("l", "loss_mode", "Loss: rank 0/all", show=False),
        Binding("k", "kill_node", "Kill node"),
        Binding("K", "kill_run", "Kill run", key_display="K"),
        Binding("r", "restart_node", "Restart node"),
        Binding("R", "restart_run", "Restart run", key_display="R"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, ctl: RunController, launch: Callable[[], Awaitable] | None = None,
                 clock: Callable[[], float] = time.time, exit_on_done: bool = False,
                 panes: list[tuple] | None = None, gc_tuning: bool = False):
        super().__init__()
        self.ctl = ctl
        self.read_only = ctl.me.read_only  # `rankdeck watch`: console/tui/readonly.py
        if self.read_only:
            drop_changing_keys(self)
        self.launch = launch
        self.clock = clock
        self.exit_on_done = exit_on_done
        self.initial_panes = panes
        self.gc_tuning = gc_tuning
        self.launching = launch is not None
        self.feed = RunFeed(ctl.state, self, ctl.secrets)
        self._ended_seen = False

    # -- composing -------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        state, secrets = self.ctl.state, self.ctl.secrets
        # Kept as attributes: App.query_one looks at the active screen, which is a modal
        # while help or a confirmation is open, and lines keep arriving meanwhile.
        self.header = RunHeader(state, self.ctl.record, clock=self.clock, id="header")
        self.nodes = NodesTable(state, id="nodes")
        self.gpus = GpuPanel(state, id="gpus")
        self.logs = LogPanes(state, self.feed.watch, secrets, self.initial_panes,
                             fetch=self.ctl.scrollback, id="logs")
        self.chart = LossChart(state, id="loss")
        self.events = EventsLog(state, secrets, id="events")
        self.prompt = PromptBar(id="prompt")
        self.side = Vertical(id="side")
        yield self.header
        with Horizontal(id="body"):
            with self.side:
                yield self.nodes
                yield self.gpus
            with Vertical(id="main"):
                yield self.logs
                with Horizontal(id="bottom"):
                    yield self.chart
                    yield self.events
        yield self.prompt
        yield SteadyFooter()

    def on_mount(self) -> None:
        if self.read_only:  # the widgets' own keys too (the nodes table's)
            for widget in self.screen.walk_children(with_self=True):
                drop_changing_keys(widget)
        for widget, title in ((self.nodes, "nodes & ranks"), (self.gpus, "GPUs"),
                              (self.events, "events"), (self.chart, "loss")):
            widget.border_title = title
        self.header.phase = "launching" if self.launching else None
        self.feed.start()
        self.nodes.focus()
        if self.launch is not None:
            self.run_launch()
        if self.gc_tuning:
            self.call_after_refresh(tune_gc)

    def on_unmount(self) -> None:
        self.feed.close()

    # -- launch ----------------------------------------------------------------------------
    @work(exclusive=True, group="launch")
    async def run_launch(self) -> None:
        header = self.header

        def sync_progress(line: str, final: bool) -> None:  # --sync: the header shows it
            header.sync_line = None if final else line
            header.update_info()
        self.ctl.sync_listeners.append(sync_progress)
        try:
            await self.launch()  # a failure is kept by the controller (its nodes, exit code)
        except LaunchError as exc:
            header.phase = "launch failed"
            self.notify(str(exc), title="launch failed", severity="error", timeout=60)
        except Exception as exc:  # a bug or an unexpected transport error: show, don't die
            header.phase = "launch failed"
            self.notify("%s: %s" % (type(exc).__name__, exc), title="launch failed",
                        severity="error", timeout=60)
        else:
            header.phase = None
        finally:
            self.ctl.sync_listeners.remove(sync_progress)
            header.sync_line = None
            self.launching = False
            header.record = self.ctl.record
            header.update_info()
            self.post_message(RunChanged())

    def notify(self, message: str, *, markup: bool = False, **kwargs) -> None:
        """Every toast is plain text by default: messages carry host and user text, and
        ``[/opt/site/env.sh]`` or ``[rank0]:`` is markup that would end the app."""
        super().notify(clean(message, limit=16384), markup=markup, **kwargs)

    # -- routing messages ------------------------------------------------------------------
    def on_log_lines(self, message: LogLines) -> None:
        if self.logs.is_attached:
            self.logs.add_lines(message.lines)

    def on_run_changed(self, message: RunChanged) -> None:
        if not self.nodes.is_attached:  # shutting down: the feed's last messages
            return
        self.header.update_info()
        self.logs.refresh_titles()
        self._refresh_in_turn([self.nodes.refresh_rows, self.gpus.refresh_rows,
                               self.chart.update_chart])
        final = self.ctl.state.run_state()
        if final in RUN_ENDED and not self._ended_seen and not self.launching:
            self._ended_seen = True
            self.notify("run %s %s; q quits" % (self.ctl.run_id, final), title="run ended",
                        severity="information" if final == "succeeded" else "error",
                        timeout=30)
            if self.exit_on_done:
                self.exit(self.ctl.exit_code())

    def _refresh_in_turn(self, steps: list) -> None:
        """The large widgets redrawn a few frames apart: at 512 ranks the nodes table, GPU
        panel and loss chart painted in the same frame took 70-90 ms, and a key pressed
        meanwhile waited for all of it (bench/tui.py; docs/BENCHMARKS.md, "The view"). A timer, not call_after_refresh: that one can run before the first
        widget's frame."""
        if not self.nodes.is_attached:
            return
        first, *rest = steps
        first()
        if rest:
            self.set_timer(TURN_S, lambda: self._refresh_in_turn(rest))

    def on_run_event_added(self, message: RunEventAdded) -> None:
        if self.events.is_attached:
            self.events.add(message.event)
        if message.event.kind == "verdict" and self.nodes.is_attached:
            verdict_arrived(self)

    def on_source_chosen(self, message: SourceChosen) -> None:
        self.logs.show(message.source)
        paint_now(self.screen)  # the answer to the Enter or click first, as for `]`

    def on_filter_changed(self, message: FilterChanged) -> None:
        pattern = re.compile(message.pattern) if message.pattern else None
        self.logs.set_options(pattern=pattern)

    def on_goto_submitted(self, message: GotoSubmitted) -> None:
        text, state = message.text, self.ctl.state
        if text in state.nodes:
            self.logs.show((NODE, text))
        elif text == "all":
            self.logs.show((ALL, None))
        elif text.lstrip("r").isdigit():
            self.logs.show((RANK, int(text.lstrip("r"))))
        else:
            self.notify("no rank or node %r" % text, severity="error")
            return
        paint_now(self.screen)

    def on_follow_changed(self, message: FollowChanged) -> None:
        if self.logs.is_attached:
            self.logs.refresh_titles()

    # -- actions ---------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The priority keys act on the main screen only (None: shown, off under a modal,
        like the other keys), and not while typing in the prompt: there they are text
        (False). A read-only console does nothing that changes the run (False)."""
        if self.read_only and changes_run(action):
            return False
        if action in PRIORITY_ACTIONS:
            if len(self.screen_stack) > 1:
                return None
            if self.focused is self.prompt:
                return False
        return True

    def push_screen(self, screen, *args, **kwargs):
        """A read-only console's dialogs lose their keys that change the run too."""
        if self.read_only and isinstance(screen, Screen):
            drop_changing_keys(screen)
        return super().push_screen(screen, *args, **kwargs)

    def action_detach(self) -> None:
        self.exit(self.ctl.exit_code())

    def action_help(self) -> None:
        self.push_screen(HelpScreen(key_sections(self)))

    def action_filter(self) -> None:
        pattern = self.logs.pattern
        self.prompt.open("filter", pattern.pattern if pattern else "")

    def action_goto(self) -> None:
        self.prompt.open("goto")

    def action_worst(self) -> None:
        """The nodes table's cursor on the worst row (shown if zoomed away), focused."""
        self.side.display = True
        what = self.nodes.go_to_worst()
        self.screen.set_focus(self.nodes)
        if what is not None:
            self.notify("worst: %s" % what, timeout=4)

    def action_zoom(self) -> None:
        side = self.side
        side.display = not side.display
        if not side.display and self.focused in (self.nodes, self.gpus):
            self.logs.focus_pane(self.logs.active)

    def action_clear_filter(self) -> None:
        if self.logs.pattern is not None:
            self.logs.set_options(pattern=None)

    def action_step(self, delta: int) -> None:
        self.logs.step(delta)
        paint_now(self.screen)  # the key's answer before more lines are taken in

    def action_cycle_source(self) -> None:
        self.logs.cycle_kind()
        paint_now(self.screen)

    def action_add_pane(self) -> None:
        self.logs.add_pane()

    def action_remove_pane(self) -> None:
        self.logs.remove_pane()

    def action_focus_pane(self, index: int) -> None:
        self.logs.focus_pane(index)

    def action_follow(self) -> None:
        self.logs.toggle_follow()

    def action_toggle(self, option: str) -> None:
        logs = self.logs
        logs.set_options(**{option: not getattr(logs, option)})
        self.notify("%s %s" % (option, "on" if getattr(logs, option) else "off"), timeout=2)

    def action_loss_mode(self) -> None:
        chart = self.chart
        chart.all_ranks = not chart.all_ranks

    def action_why(self) -> None:
        open_verdict(self)

    def action_lateness(self) -> None:
        open_lateness(self)

    def action_hosts(self) -> None:
        self.push_screen(HostsScreen(self.ctl))

    def action_stacks(self, node: str | None = None) -> None:
        open_stacks(self, node or self.nodes.current_node)

    def action_kill_node(self) -> None:
        self.ask("stop", self.nodes.current_node or "")

    def action_kill_run(self) -> None:
        self.ask("stop")

    def action_restart_node(self) -> None:
        self.ask("restart", self.nodes.current_node or "")

    def action_restart_run(self) -> None:
        self.ask("restart")

    def action_cordon_node(self) -> None:
        open_cordon(self, self.nodes.current_node)

    def ask(self, verb: str, node: str | None = None) -> None:
        """Confirm, then stop/restart ``node`` ("" = none selected) or the whole run."""
        if self.read_only:  # the palette's commands are not offered; this is the backstop
            self.notify("this console is read-only (rankdeck watch)", severity="warning")
            return
        if node == "":
            self.notify("no node selected: pick one in the nodes table", severity="warning")
            return
        screen = control_confirm(verb, node, self.ctl.run_id, len(self.ctl.state.nodes),
                                 self.ctl.static_world())
        self.push_screen(screen, lambda yes: self.run_control(verb, node) if yes else None)

    @work(group="control")
    async def run_control(self, verb: str, node: str | None) -> None:
        what = node or "the run"
        self.notify("%s %s..." % ("stopping" if verb == "stop" else "restarting", what),
                    timeout=3)
        try:
            results = await (self.ctl.stop(node) if verb == "stop" else self.ctl.restart(node))
        except Exception as exc:  # e.g. AgentError: tell the user, keep the console up
            self.notify("%s %s failed: %s" % (verb, what, exc), severity="error", timeout=30)
            return
        lines = control_lines(verb, results)
        text = "\n".join(line.text for line in lines) or "nothing to %s" % verb
        failed = any(line.problem for line in lines)
        self.notify(text, title="%s %s" % (verb, what), severity="error" if failed else
                    "information", timeout=15 if failed else 6)

    def export_screenshot(self, *, title: str | None = None, simplify: bool = False) -> str:
        """Textual's SVG, each word drawn at its own column (screenshot.py says why)."""
        return whole_spaces(super().export_screenshot(title=title, simplify=simplify))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from rankdeck_commands(self)


async def run_app(ctl: RunController, launch: Callable[[], Awaitable] | None = None,
                  **run_kwargs) -> int:
    """Show ``ctl``'s run until the user quits; returns the exit code (``ctl.exit_code()``;
    the caller then leaves the run: ``ctl.leave()``).

    ``launch`` (optional) is awaited as a worker inside the app. ``run_kwargs`` go to
    ``App.run_async`` (``headless=True, size=..., auto_pilot=...`` for tests).
    """
    app = RankdeckApp(ctl, launch, gc_tuning=True)
    thresholds = gc.get_threshold()
    try:
        await app.run_async(**run_kwargs)
    finally:
        untune_gc(thresholds)
    # The screen that showed how it went is gone: say it again, as --no-tui does.
    if ctl.launch_error is not None:
        print(clean_lines("rankdeck: launch failed: %s" % ctl.launch_error, ctl),
              file=sys.stderr)
    elif ctl.state.run_state() not in RUN_ENDED:  # detached: nothing was stopped
        print(detach_hint(ctl.run_id), file=sys.stderr)
    else:  # the run ended: its status table, with each failed node's cause
        print(clean_lines(status_table(ctl.status()), ctl))
    return ctl.exit_code()


def clean_lines(text: str, ctl: RunController) -> str:
    """``text`` made safe for the terminal line by line, the run's secrets masked."""
    return "\n".join(clean(line, ctl.state.masker) for line in text.split("\n"))
