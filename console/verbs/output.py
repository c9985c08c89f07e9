"""What a verb shows on this terminal: a run followed in the TUI or headless until it ends or
the user detaches (then left), and a JSON document on stdout (``--json``)."""

from __future__ import annotations

import json
import sys

from .headless import run_headless
from ..run.run import RunController


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def wants_tui(args) -> bool:
    return not getattr(args, "no_tui", True) and sys.stdout.isatty()


async def follow(ctl: RunController, args, launch=None, resumed: bool = False) -> int:
    """Show the run (TUI or headless) until it ends or the user detaches, then leave it
    (its store stopped if it ended, its status saved); the exit code. ``launch`` is awaited
    once the view listens (it launches the run, or subscribes to a running one)."""
    ctl.state.budget.limit = args.line_budget << 20
    ctl.me.attach = True  # listed among the run's consoles (a launch connects after this)
    try:
        if wants_tui(args):
            # Lazy for start-up time: Textual takes about a second to import, and headless
            # runs, scripts and every other verb never need it.
            from ..tui.app import run_app

            return await run_app(ctl, launch)
        return await run_headless(ctl, launch, resumed, getattr(args, "by_node", False))
    finally:
        await ctl.leave()
