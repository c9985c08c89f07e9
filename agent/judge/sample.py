"""The run's judge asks every node for its ranks' stacks and flight-recorder tails, twice,
and decides who is stuck (agent/rules/verdict.py): the verdict when a stall starts, again while it
lasts, and when a console asks. A verdict a console asked for (``w``, ``rankdeck why``, a
read-only watcher) is journaled and answered, and nothing more: the judge's own looks alone
set the verdict its schedule (agent/rules/judge.py ``verdict_again_due``) and ``--on-hang``
read, so a console's question neither stands in for the judge's next look nor postpones it.
A read-only watcher's question (``signals=False``, by way of agent/serve/server.py) is asked
of every node so: each sends its ranks no signal for their stacks (agent/torchrun/stacks.py:
py-spy alone), where a report otherwise SIGUSR1s every rank that catches it and SIGCONTs a
stopped one when py-spy is missing.

A part of the run's judge (agent/judge/judge.py), which mixes :class:`Sampler` into its ``Judge``:
these methods work on the judge's view, lines, lock and journal (``self.view``,
``self.lines``, ``self.lock``, ``self.write``); a verdict on a stall is acted on by the
``--on-hang`` policy (agent/judge/policy.py).

Standard library only; Python >= 3.9.
"""

import threading
import time

from ..wire import judge as judge_wire
from ..rules.judge import event, stalled, verdict_proposals
from ..rules.verdict import decide
from ..rules.notify import ASKED

WHY_TIMEOUT = 20.0
SAMPLE_GAP = 1.0


class Sampler:
    """The judge's verdicts; mixed into ``Judge`` (agent/judge/judge.py)."""

    def ask_all(self, op, args, timeout, skip=()):
        """{node: data or an Exception} from every node but those in ``skip``, in parallel."""
        with self.lock:
            lines = {node: nl for node, nl in self.lines.items() if node not in skip}
        out = {node: judge_wire.WireError("%s is not connected to the judge" % node)
               for node in self.view.nodes if node not in lines and node not in skip}
        threads = []

        def one(node, nl):
            try:
                out[node] = nl.request(op, args, timeout)
            except judge_wire.WireError as exc:
                out[node] = exc
        for node, nl in lines.items():
            t = threading.Thread(target=one, args=(node, nl), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout + 5)
        return out

    def _sample(self, unanswered=None, signals=True):
        """(reports, {node: cause}); the nodes in ``unanswered`` (an earlier sample's) are not
        asked again: each would cost another WHY_TIMEOUT of the same silence. ``signals``
        False: every node is told to signal none of its ranks."""
        reports, unreachable = [], dict(unanswered or {})
        args = {} if signals else {"signals": False}
        for node, res in self.ask_all("why", args, WHY_TIMEOUT, skip=unreachable).items():
            if isinstance(res, Exception):
                unreachable[node] = str(res)[:200]
                continue
            for r in res.get("ranks") or []:
                if isinstance(r, dict) and isinstance(r.get("rank"), int):
                    reports.append(dict(r, node=node))
        return reports, unreachable

    def take_verdict(self, reason, signals=True):
        """Two samples of every node's ranks, one verdict; journaled. The judge's own (any
        ``reason`` but ASKED) is kept as the view's verdict, which its schedule and
        ``--on-hang`` act on; an asked one is not. ``signals`` False: no node signals its
        ranks for it."""
        earlier, unanswered = self._sample(signals=signals)
        time.sleep(SAMPLE_GAP)
        reports, unreachable = self._sample(unanswered, signals=signals)
        with self.lock:
            expected = self.view.alive_ranks()
        verdict = decide(reports, unreachable, expected, earlier=earlier)
        verdict = self.masker.mask_tree(verdict)
        proposals = []
        if reason != ASKED:  # a console's question is answered, and changes nothing here
            with self.lock:
                self.view.verdict = verdict
                self.view.verdict_at = self.now()
                proposals = verdict_proposals(self.view, verdict, self.now())  # a hang again
        self.write(event("verdict", None, verdict=verdict, reason=reason,
                         text="who is stuck: %s" % verdict.get("summary")))
        for ev in proposals:
            self.write(ev)
        return verdict

    def _verdict_then_act(self, reason):
        try:
            verdict = self.take_verdict(reason)
            if self.on_hang != "warn" and verdict.get("suspects"):
                with self.lock:
                    still = bool(stalled(self.view))
                if still:
                    self.act_on_hang(verdict)
        except Exception as exc:  # a bug in a rule must never end the judge
            self.write(event("judge_error", None, text="the verdict failed: %r" % (exc,)))
        finally:
            with self.lock:
                self.verdict_running = False
