"""Taking a verdict from a live run: ask every node for its ranks' stacks and flight-recorder
tails (the agent's ``why`` request, agent/torchrun/fr_dump.py), twice, and decide (agent/rules/verdict.py).

Works on any object with ``gather_nodes``, ``links`` and ``state`` (a RunController), so this
module sits below the controller and both the verbs and the controller's stall watch use it.
"""

from __future__ import annotations

import asyncio
import sys

from ..lines.sanitize import clean, mask_tree
from agent.rules.verdict import decide

SAMPLE_GAP_S = 1.0  # between the two samples: a healthy job enters many collectives in it
REQUEST_TIMEOUT_S = 20.0


async def _sample(ctl, unanswered: dict[str, str] | None = None
                  ) -> tuple[list[dict], dict[str, str]]:
    """(one report per rank that answered, {node: cause} for nodes that did not). The nodes
    in ``unanswered`` (an earlier sample's) are not asked again: each would cost another
    REQUEST_TIMEOUT_S of the same silence (as the judge's, agent/judge/sample.py)."""
    reports: list[dict] = []
    unreachable: dict[str, str] = dict(unanswered or {})
    names = [n for n in ctl.links if n not in unreachable]
    if not names:
        return reports, unreachable
    results = await ctl.gather_nodes(
        lambda link: link.request("why", run_root=link.run_root, node=link.name,
                                  python=link.host.python or sys.executable,
                                  timeout=REQUEST_TIMEOUT_S), names)
    for node, res in results.items():
        if isinstance(res, BaseException):
            unreachable[node] = clean(str(res), limit=200)
            continue
        for r in res.get("ranks") or []:
            if isinstance(r, dict) and isinstance(r.get("rank"), int):
                reports.append(dict(r, node=node))
    return reports, unreachable


LIVE = ("running", "stalled", "starting")


def expected_ranks(ctl) -> dict[int, str]:
    """rank -> node for every rank the run knows to be alive: from the live state, or, in a
    console that has not followed the run (``rankdeck why``), from the status saved last."""
    known = {rank: rs.node for rank, rs in ctl.state.ranks.items() if rs.state in LIVE}
    if known:
        return known
    saved = (getattr(ctl, "record", None) or {}).get("status") or {}
    return {r["rank"]: n["name"] for n in saved.get("nodes") or [] for r in n.get("ranks") or []
            if isinstance(r.get("rank"), int) and r.get("state") in LIVE}


async def take_verdict(ctl, gap: float = SAMPLE_GAP_S) -> dict:
    """The verdict now; also kept in ``ctl.state.verdict`` for status, the view and headless."""
    earlier, unanswered = await _sample(ctl)
    await asyncio.sleep(gap)
    reports, unreachable = await _sample(ctl, unanswered)
    verdict = mask_tree(decide(reports, unreachable, expected_ranks(ctl), earlier=earlier),
                        ctl.state.masker)
    ctl.state.set_verdict(verdict)
    return verdict

