"""`rankdeck actions RUN`: who changed the run, from every node's action log, oldest first.

Each node's agent keeps the log (agent/host/actions.py); this asks every reachable node for its
whole log, page by page to its end (an agent answers at most 1 MiB a request), merges them by
time and prints one line an action, or ``--json`` a list. The list holds the newest
:data:`ACTIONS_MAX` actions; a note says how many older ones were left out, and which nodes'
logs had dropped their oldest lines (an agent keeps a bounded log). All of it is host text:
cleaned (console/model/consoles.py) and the run's secrets masked before printing.
"""

from __future__ import annotations

import heapq

from ..model.consoles import action_line, action_record, when
from ..lines.sanitize import clean, mask_tree

ACTIONS_MAX = 10000  # the newest actions listed
PAGES_MAX = 256  # a node's pages asked at most (its agent keeps about 8 MiB: 8 pages)


async def node_actions(link) -> tuple[list[dict], int, bool]:
    """Every action in ``link``'s node's log, page by page (the newest ``ACTIONS_MAX`` kept);
    how many it read; and whether the log's oldest lines were gone (rotated away) before
    it was read."""
    out: list[dict] = []
    offset, lost, seen = 0, False, 0
    for _ in range(PAGES_MAX):
        page = await link.request("actions", run_root=link.run_root, node=link.name,
                                  offset=offset, timeout=60)
        if not isinstance(page, dict):  # host text: an answer of another shape ends the log
            break
        start, end = page.get("start"), page.get("end")
        if offset == 0 and isinstance(start, int) and not isinstance(start, bool) and start > 0:
            lost = True
        recs = page.get("actions")
        before = len(out)
        out.extend(filter(None, map(action_record, recs if isinstance(recs, list) else ())))
        seen += len(out) - before
        del out[:-ACTIONS_MAX]
        # an older agent says no `more`: its one page is the log
        if page.get("more") is not True or isinstance(end, bool) or not isinstance(end, int) \
                or end <= offset:
            break
        offset = end
    return out, seen, lost


async def run_actions(ctl) -> tuple[list[dict], dict, list[str]]:
    """Every node's action log, merged by time, secrets masked (the newest ``ACTIONS_MAX``);
    {node: error} for the nodes that could not be asked; and notes on what the list leaves
    out. ``ctl``: a RunController, not connected yet."""
    failed = await ctl.connect_all(reconnect=False)
    names = ctl.connected()
    answers = await ctl.gather_nodes(node_actions, names)
    logs, lost, seen = [], [], 0
    for name, answer in answers.items():
        if isinstance(answer, BaseException):
            failed[name] = answer
            continue
        logs.append(sorted(answer[0], key=lambda rec: rec["ts"]))
        seen += answer[1]
        if answer[2]:
            lost.append(name)
    merged = list(heapq.merge(*logs, key=lambda rec: rec["ts"]))
    notes = []
    merged = merged[-ACTIONS_MAX:]
    if seen > len(merged):
        notes.append("%d older actions not listed (the newest %d are)" % (
            seen - len(merged), len(merged)))
    if lost:
        notes.append("the oldest actions of %s were dropped from the node's bounded log"
                     % ", ".join(sorted(lost)))
    return [mask_tree(rec, ctl.state.masker) for rec in merged], failed, notes


def action_rows(actions: list[dict], masker) -> list[str]:
    """``2026-11-26 03:40:12  node1  bob@laptop (login alice) restarted node1: ok`` each."""
    if not actions:
        return ["no actions recorded (the run's agents keep launch, stop, restart, sync, "
                "cordon and signal requests)"]
    return [clean("%s  %-10s %s" % (when(rec["ts"]), rec["node"] or "-", action_line(rec)),
                  masker) for rec in actions]
