"""What the views say about a run, derived from RunState: plain functions, no widgets.

Launch phase of a node, run progress (step, steps/s, ETA), rank ranges ("ranks 0-7"), state
colours and short number formats. Kept apart from the widgets so tests and the headless
side can use them without a screen.
"""

from __future__ import annotations

import statistics
import time

from ..state import NodeState, RunState

STATE_STYLE = {
    "connecting": "cyan", "connected": "cyan", "preflight": "cyan",
    "preflight failed": "bold red", "bad preflight": "bold red", "starting": "cyan", "rendezvous": "cyan",
    "running": "green", "stalled": "bold yellow", "restarting": "magenta",
    "stopping": "magenta", "exited": "green", "stopped": "dim", "failed": "bold red",
    "unreachable": "bold red", "lost": "bold red",
}

STEP_FLAGS = ("--steps", "--max-steps", "--max_steps", "--total-steps", "--total_steps")


def state_style(state: str) -> str:
    """Style of a state, or of a phase with detail ("failed (1)")."""
    return STATE_STYLE.get(state) or STATE_STYLE.get(state.split(" ")[0], "")


def ranks_by_node(state: RunState) -> dict[str, list]:
    """Every node's ranks in rank order, in one pass (``ranks_of`` scans all ranks)."""
    out: dict[str, list] = {name: [] for name in state.nodes}
    for rank in sorted(state.ranks):
        rs = state.ranks[rank]
        out.setdefault(rs.node, []).append(rs)
    return out


def node_phase(state: RunState, ns: NodeState, ranks: list | None = None) -> str:
    """A node's launch phase or state in words: connecting, starting, rendezvous, running..."""
    if ns.state == "starting":
        ranks = state.ranks_of(ns.name) if ranks is None else ranks
        if not ranks:
            return "starting"
        if any(r.state in ("running", "stalled") for r in ranks):
            return "running"
        return "rendezvous"  # workers exist, no step yet: waiting for peers / first step
    if ns.state in ("exited", "failed") and ns.exit_code is not None:
        return "%s (%s)" % (ns.state, ns.exit_code)
    if ns.state == "preflight failed":
        return "bad preflight"  # fits the state column; the problems are in the detail
    return ns.state


def node_detail(state: RunState, ns: NodeState, ranks: list | None = None) -> str:
    """The free-text column of a node: its cause when it has one, else what it waits for."""
    if ns.cause:
        return ns.cause
    phase = node_phase(state, ns, ranks)
    return {"connecting": "connecting to agent", "connected": "agent ready",
            "preflight": "checking python, torch, GPUs, disk, rendezvous reachability",
            "starting": "starting torchrun", "rendezvous": "waiting for first step",
            "restarting": "restarting torchrun"}.get(phase, "")


def launch_progress(state: RunState) -> str:
    """How far the launch is, as counts of node phases: "2 preflight, 2 starting"."""
    counts: dict[str, int] = {}
    by_node = ranks_by_node(state)
    for ns in state.nodes.values():
        phase = node_phase(state, ns, by_node.get(ns.name, [])).split(" (")[0]
        counts[phase] = counts.get(phase, 0) + 1
    return ", ".join("%d %s" % (n, phase) for phase, n in counts.items())


def node_step(state: RunState, name: str, ranks: list | None = None) -> int | None:
    ranks = state.ranks_of(name) if ranks is None else ranks
    steps = [r.step for r in ranks if r.step is not None]
    return min(steps) if steps else None


def run_step(state: RunState) -> int | None:
    """The step every rank has reached (DDP ranks step together; the slowest bounds it)."""
    steps = [r.step for r in state.ranks.values() if r.step is not None]
    return min(steps) if steps else None


def total_steps(record: dict | None) -> int | None:
    """``--steps N`` (or ``--max-steps``) from the run spec's trainer arguments, if given."""
    args = list(((record or {}).get("spec") or {}).get("args") or [])
    for i, arg in enumerate(args):
        for flag in STEP_FLAGS:
            value = None
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return None
    return None


def steps_per_s(state: RunState) -> float | None:
    """From the trainers' own step times (median over recent steps of the lowest rank)."""
    for rank in sorted(state.ranks):
        rs = state.ranks[rank]
        if rs.step_times:
            med = statistics.median(rs.step_times)
            return 1.0 / med if med > 0 else None
    return None


def eta_s(state: RunState, record: dict | None, rate: float | None) -> float | None:
    total = total_steps(record)
    step = run_step(state)
    if total is None or step is None or not rate:
        return None
    return max(0.0, (total - step) / rate)


def hms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return "%d:%02d:%02d" % (h, rest // 60, rest % 60)


def clock_text(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "--:--:--"


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else "%d-%d" % (ordered[i], ordered[j]))
        i = j + 1
    return ",".join(out)


def fmt_float(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return "%.2e" % v
    return "%.*f" % (digits, v)


def gib(n: float | None) -> str:
    return "-" if n is None else "%.1f" % (n / 2 ** 30)


def control_summary(verb: str, results: dict) -> tuple[str, bool]:
    """One notification text for a stop/restart fan-out and whether any node failed."""
    parts, failed = [], False
    for name, res in results.items():
        if isinstance(res, BaseException):
            failed = True
            parts.append("%s: %s" % (name, res))
        elif verb == "stop":
            left = res.get("left") or []
            failed = failed or bool(left)
            parts.append("%s: %s%s" % (name, res.get("state", "stopped"),
                                       " (processes left: %s)" % left if left else ""))
        else:
            parts.append("%s: %s (launch %s)" % (name, res.get("state", "restarted"),
                                                 res.get("launches", "?")))
    return "\n".join(parts) or "nothing to %s" % verb, failed
