"""What the views say about a run, derived from RunState: plain text, no widgets.

A node's launch phase, run progress (step, steps/s, ETA), the end-of-run status table, the
outcome of a stop or restart, the detach hint. The TUI (console/tui) and the headless
printer and commands both use them; Rich styles and widgets stay in console/tui.
"""

from __future__ import annotations

import statistics
import time
from typing import NamedTuple

from . import health, rendezvous
from ..errors import AgentError
from ..lines.sanitize import clean
from .state import RunState
from .nodes import NodeState
from ..lines.text import columns, kill_summary

STEP_FLAGS = ("--steps", "--max-steps", "--max_steps", "--total-steps", "--total_steps")


# -- a node's phase ----------------------------------------------------------------------------
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
    """The free-text column of a node: its cause when it has one, else what it waits for
    ("" for a node running as it should: the table shows its telemetry there)."""
    if ns.cause:
        return ns.cause
    if ns.state == "spare":  # its torchrun loaded, held (docs/SURGERY.md, "Warm spares")
        return "warm" if ns.warm else ""
    phase = node_phase(state, ns, ranks)
    if phase == "running" and (ns.phase or {}).get("name") == "workers running" and \
            not state.waiting:
        return ""  # nothing to wait for: the row shows the node's telemetry instead
    if ns.phase and phase not in ("connecting", "connected", "preflight", "syncing"):
        # what the node's launcher says it does
        text = "%s: %s" % (state.launcher, rendezvous.phase_text(ns.phase))
        wait = state.waiting
        if wait and any(m["node"] == ns.name for m in wait["missing"]):
            text = "NOT JOINED the rendezvous; " + text
        return text
    return {"connecting": "connecting to agent", "connected": "agent ready",
            "preflight": "checking python, torch, GPUs, disk, rendezvous reachability",
            "starting": "starting " + state.launcher, "rendezvous": "waiting for first step",
            "syncing": "sending code into the workdir",
            "restarting": "restarting " + state.launcher}.get(phase, "")


def launch_progress(state: RunState) -> str:
    """How far the launch is, as counts of node phases: "2 preflight, 2 starting"."""
    counts: dict[str, int] = {}
    by_node = ranks_by_node(state)
    for ns in state.nodes.values():
        phase = node_phase(state, ns, by_node.get(ns.name, [])).split(" (")[0]
        counts[phase] = counts.get(phase, 0) + 1
    return ", ".join("%d %s" % (n, phase) for phase, n in counts.items())


# -- progress ----------------------------------------------------------------------------------
def node_step(state: RunState, name: str, ranks: list | None = None) -> int | None:
    """The step every rank of node ``name`` has reached."""
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
    """Seconds to the last step at ``rate`` steps/s; None without a known total."""
    total = total_steps(record)
    step = run_step(state)
    if total is None or step is None or not rate:
        return None
    return max(0.0, (total - step) / rate)


# -- texts at the end of a command ---------------------------------------------------------------
def shown(value):
    """``value`` (host text, or a document holding it) safe to print: every string cleaned
    of escapes and control characters (an OSC 52 clipboard write, a title, a screen clear)
    and on one line (a host's newline must not forge a row)."""
    if isinstance(value, str):
        return clean(value).replace("\n", " ")
    if isinstance(value, dict):
        return {k: shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(v) for v in value]
    return value


def status_table(status: dict) -> str:
    """The run's state, one row per rank, from a ``status`` document (RunState.status)."""
    status = shown(status)  # paths, causes, phases: a host's text
    # a health column once a deep preflight ran (launch --preflight deep: model/health.py)
    checked = any(n.get("health") for n in status["nodes"])
    rows = [("node", "state", "restarts", "exit") + (("health",) if checked else ()) +
            ("rank", "rank state", "step", "loss")]
    for node in status["nodes"]:
        used, left = node["restarts_used"], node["restarts_left"]
        base = (node["name"], node["state"], "%d used, %d left" % (used, left),
                "" if node["exit_code"] is None else str(node["exit_code"]))
        base += (health.short(health.checked(node.get("health"))),) if checked else ()
        if not node["ranks"]:
            rows.append(base + ("-", "-", "-", "-"))
        for r in node["ranks"]:
            loss = "" if r["loss"] is None else "%.4f" % r["loss"]
            rows.append(base + (str(r["rank"]), rank_state_text(r), str(r["step"] or ""),
                                loss))
            base = ("",) * len(base)
    head = "run %s: %s (%.0f s)" % (status["run_id"], status["state"],
                                    time.time() - status.get("started", time.time()))
    causes = ["  %s: %s" % (n["name"], n["cause"]) for n in status["nodes"] if n.get("cause")]
    code = [sync_text(status["sync"])] if status.get("sync") else []
    ckpts = [checkpoints_text(status["checkpoints"])] if status.get("checkpoints") else []
    ckpts += ["  %s resumed from step %s: %s" % (r["node"], r["step"], r["path"] or "?")
              for r in status.get("resumed_from") or ()]
    return "\n".join([head] + code + ckpts + waiting_lines(status) + columns(rows, rule=True) +
                     (["causes:"] + causes if causes else []) + phase_lines(status))


def waiting_lines(status: dict) -> list[str]:
    """``waiting: rendezvous round 3: 2/4 nodes joined in 75 s; not joined: node1 (...)``."""
    wait = status.get("waiting_for")
    return ["waiting: %s" % wait["text"]] if wait else []


def phase_lines(status: dict) -> list[str]:
    """Each node's launcher's phase (console/model/rendezvous.py), when the nodes reported one."""
    lines = ["  %s: %s" % (n["name"], n["phase"]["text"]) for n in status["nodes"]
             if n.get("phase")]
    return ["%s:" % status.get("launcher", "torchrun")] + lines if lines else []


def rank_state_text(rank: dict) -> str:
    """A rank's state for the table; ``running (silent)`` for one that prints no steps."""
    if rank.get("silent") and rank["state"] in ("running", "stalled"):
        return "%s (silent)" % rank["state"]
    return rank["state"]


def checkpoints_text(ckpts: list[dict]) -> str:
    """``checkpoints: 4 saved, 2 deleted by the trainer; newest step 200 at /ckpt/... (node1);
    last complete step 150 at /ckpt/...`` (``, complete`` when the newest is the last complete)."""
    there = [c for c in ckpts if c.get("exists")]
    text = "checkpoints: %d saved" % len(ckpts)
    if len(there) < len(ckpts):
        text += ", %d deleted by the trainer" % (len(ckpts) - len(there))
    if there:
        text += "; newest step %s at %s (%s)" % (there[-1]["step"], there[-1]["path"],
                                                 there[-1]["node"])
        last = next((c for c in there if c.get("last_complete")), None)
        if last is there[-1]:
            text += ", complete"
        elif last is not None:
            text += "; last complete step %s at %s" % (last["step"], last["path"])
    return text


def sync_text(sync: dict) -> str:
    """``code: tree 3f9a0c1d2e4b (112 files, 4.2 MB) from /home/me/proj`` (``--sync``)."""
    return "code: tree %s (%d files, %.1f MB) from %s" % (
        str(sync.get("tree", "?"))[:12], sync.get("files", 0), sync.get("bytes", 0) / 1e6,
        sync.get("dir", "?"))


class ControlLine(NamedTuple):
    """One line about a node's answer to a stop or restart; ``problem`` is None, "failed"
    or "unreachable" (the connection to the node is gone)."""

    text: str
    problem: str | None = None


def control_lines(verb: str, results: dict) -> list[ControlLine]:
    """What a stop/restart fan-out did, node by node (``results``: {node: answer or error})."""
    out = []
    for name, res in results.items():
        if isinstance(res, BaseException):
            closed = isinstance(res, AgentError) and res.kind == "closed"
            out.append(ControlLine("%s: %s" % (name, shown(str(res))),
                                   "unreachable" if closed else "failed"))
            continue
        res = shown(res)  # the node's answer: its agent's words
        if verb == "stop":
            out.append(ControlLine("%s: %s (%s)" % (name, res.get("state", "stopped"),
                                                   kill_summary(res.get("kill") or {}))))
            left = res.get("left") or []
            if left:
                out.append(ControlLine("%s: processes still there: %s" % (name, left), "failed"))
        else:
            out.append(ControlLine("%s: %s (launch %s, restarts %s)" % (
                name, res.get("state", "restarted"), res.get("launches", "?"),
                res.get("restarts", "?"))))
    return out


def detach_hint(run_id: str) -> str:
    """Said when the console lets go of a run that goes on."""
    return ("rankdeck: detached; the run goes on. `rankdeck attach %s` to watch it again, "
            "`rankdeck stop %s` to stop it." % (run_id, run_id))
