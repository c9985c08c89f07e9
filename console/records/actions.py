"""`rankdeck actions RUN`: who changed the run, from every node's action log, oldest first.

Each node's agent keeps the log (agent/host/actions.py); this asks every reachable node for its
whole log, merges them by time and prints one line an action, or ``--json`` a list. All of
it is host text: cleaned (console/model/consoles.py) and the run's secrets masked before printing.
"""

from __future__ import annotations

from ..model.consoles import action_line, action_record, when
from ..lines.sanitize import clean, mask_tree


async def run_actions(ctl) -> tuple[list[dict], dict]:
    """Every node's action log, merged by time, secrets masked; and {node: error} for the
    nodes that could not be asked. ``ctl``: a RunController, not connected yet."""
    failed = await ctl.connect_all(reconnect=False)
    names = ctl.connected()
    answers = await ctl.gather_nodes(lambda link: link.request(
        "actions", run_root=link.run_root, node=link.name, timeout=60), names)
    out = []
    for name, answer in answers.items():
        if isinstance(answer, BaseException):
            failed[name] = answer
            continue
        recs = answer.get("actions")
        for rec in filter(None, map(action_record, recs if isinstance(recs, list) else ())):
            out.append(mask_tree(rec, ctl.state.masker))
    out.sort(key=lambda rec: rec["ts"])
    return out, failed


def action_rows(actions: list[dict], masker) -> list[str]:
    """``2026-11-26 03:40:12  node1  bob@laptop (login alice) restarted node1: ok`` each."""
    if not actions:
        return ["no actions recorded (the run's agents keep launch, stop, restart, sync, "
                "cordon and signal requests)"]
    return [clean("%s  %-10s %s" % (when(rec["ts"]), rec["node"] or "-", action_line(rec)),
                  masker) for rec in actions]
