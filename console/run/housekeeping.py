"""The RunController's round, once a second while it follows a run (console/run/attach.py
starts it): the judge's rulings followed when the run has a judge (console/judgement/judged.py), else
the judge's rules applied here (console/judgement/local_judge.py: stalls and who is stuck; nodes
stopped once the run is over); the run's status saved for `ls` and later consoles.
"""

from __future__ import annotations

import asyncio
import time

from ..surgery.autocordon import follow_judge
from ..errors import AgentError
from ..judgement.judged import judged, settle
from .link import NodeLink
from ..judgement.local_judge import beside_judge, ends_due, judge_locally
from ..model.state import RUN_ENDED


class Housekeeping:
    """One controller's rounds (``ctl``: the RunController, console/run/run.py), and the stops
    and verdict they started."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.ending: set[str] = set()  # nodes being stopped by the run's end rules
        self.ending_stops: list[asyncio.Task] = []  # their stop requests
        self.verdict_task: asyncio.Task | None = None

    async def run(self) -> None:
        ctl = self.ctl
        last_save = float("-inf")
        while True:
            await asyncio.sleep(1.0)
            if judged(ctl.state):  # the judge on the hosts applies the rules
                settle(ctl.state)
                await follow_judge(ctl)  # its own surgeries (--auto-cordon)
                if beside_judge(ctl.state):  # the rules an older judge does not apply
                    self.start_verdict()
            else:
                stalled, again = judge_locally(ctl.state)
                if stalled or again:
                    self.start_verdict()
                if not ctl.me.read_only:
                    self.end_finished_nodes()
            now = time.monotonic()
            if now - last_save > 5 or ctl.state.run_state() in RUN_ENDED:
                last_save = now
                ctl.save_status()

    def end_finished_nodes(self) -> None:
        """Stop, once each, the nodes whose torchrun waits for what cannot come now that the
        run is over (agent/rules/judge.py ``ends_due``), telling each node how it ended."""
        for name, end in ends_due(self.ctl.state).items():
            link = self.ctl.links.get(name)
            if name in self.ending or link is None or link.stream is None:
                continue
            self.ending.add(name)
            self.ctl.state.add_event(name, "ending", end["say"])
            task = asyncio.ensure_future(self.stop_as(link, end))
            self.ctl.tasks.append(task)
            self.ending_stops.append(task)

    async def stop_as(self, link: NodeLink, end: dict) -> None:
        try:
            await link.request("stop", run_root=link.run_root, node=link.name,
                               end={"state": end["state"], "cause": end["cause"]},
                               timeout=self.ctl.stop_timeout())
        except AgentError as exc:
            self.ending.discard(link.name)  # asked again on the next round
            self.ctl.state.add_event(link.name, "ending", "stopping it failed: %s" % exc)

    def start_verdict(self) -> None:
        """A stall was just seen: say who is stuck (console/judgement/why.py), unless already asking."""
        if self.verdict_task is None or self.verdict_task.done():
            self.verdict_task = asyncio.ensure_future(self.ctl.why())
            self.ctl.tasks.append(self.verdict_task)
