"""The Rich style of each node, rank and launch state, for every widget that shows one.

The words themselves (phases, progress, tables) are plain text in console/model/summary.py.
"""

from __future__ import annotations

STATE_STYLE = {
    "connecting": "cyan", "connected": "cyan", "syncing": "cyan", "sync failed": "bold red",
    "preflight": "cyan",
    "preflight failed": "bold red", "bad preflight": "bold red", "starting": "cyan",
    "rendezvous": "cyan", "running": "green", "stalled": "bold yellow", "restarting": "magenta",
    "stopping": "magenta", "exited": "green", "stopped": "dim", "failed": "bold red",
    "unreachable": "bold red", "lost": "bold red", "gone": "bold red",
}


def state_style(state: str) -> str:
    """Style of a state, or of a phase with detail ("failed (1)")."""
    return STATE_STYLE.get(state) or STATE_STYLE.get(state.split(" ")[0], "")

# who is stuck (console/tui/verdict.py): a suspect stands out from the ranks merely waiting
SUSPECT_STYLE = "bold white on red"
WAITING_STYLE = "yellow"
