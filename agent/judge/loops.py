"""The judge's loop policy, ``launch --on-loop warn|stop|rollback`` (default stop) after
``--loop-restarts N`` (default 3): a node restarted again and again that never passes the
step it failed at (agent/rules/loops.py says when, and in which words), and ranks that resume
from different steps after a restart, named as the cause.

A part of the run's judge (agent/judge/judge.py), which mixes :class:`LoopPolicy` into its
``Judge``: the judge's connections (agent/judge/listen.py) hand it every forwarded meta
(:meth:`loop_news`, under the judge's lock), then call :meth:`loop_act` outside it; the
``--on-hang`` policy (agent/judge/policy.py) asks :meth:`loop_refuses` before it restarts a
node.

* ``loop`` event (notified as ``loop``): ``node0: no progress in 3 restarts: each failed at
  step 120``; with ``stop``, every node is stopped, failed, with those words as the cause;
  with ``rollback``, once per run, every node restarts and its ranks are told to resume from
  the checkpoint before the newest (docs/JUDGE.md, "Restart loops": the node's
  ``resume.json``); a loop after that stops the run.
* ``resume mismatch`` event: ``rank 0 resumed from step 150, ranks 1-3 from none: is the
  checkpoint folder shared by every node?``, also in the next verdict's text, and the
  ``--on-hang`` restart is refused while it stands (a restart would resume them apart again).

Standard library only; Python >= 3.9.
"""

import threading

from ..rules.judge import event
from ..rules.loops import DEFAULT_AFTER, Loops
from ..surgery.static_world import STATIC_WORLDS

ON_LOOP = ("warn", "stop", "rollback")


class LoopPolicy:
    """The judge's loop policy; mixed into ``Judge`` (agent/judge/judge.py)."""

    def loops_init(self, spec):
        after = spec.get("loop_restarts")
        self.loops = Loops(after if isinstance(after, int) else DEFAULT_AFTER)
        on_loop = spec.get("on_loop")
        self.on_loop = on_loop if on_loop in ON_LOOP else "stop"
        self.loop_due = []  # (node, words) found under the lock, acted on outside it
        self.rolled_back = None  # the step the rollback resumed before, once taken

    def loop_news(self, node, meta):
        """Events ``meta`` (forwarded by ``node``) causes: a ``loop``, a ``resume mismatch``.
        Called under the judge's lock; the action waits for :meth:`loop_act`."""
        out = []
        found = self.loops.apply(node, meta)
        if found is not None:
            out.append(self._loop_event(*found))
        if self.loops.told is not None or len(self.loops.resumed) < len(self.view.ranks):
            return out  # said, or not every rank has said yet: no look (every metric comes here)
        words = self.loops.mismatch([r for r, rs in self.view.ranks.items()
                                     if rs.node in self.view.nodes])
        if words:
            out.append(event("resume mismatch", None, resumed=dict(
                (str(r), s) for r, s in sorted(self.loops.resumed.items())), text=words))
        return out

    def _loop_event(self, node, words):
        # DeepSpeed's static world restarts as one (agent/surgery/static_world.py): it stops
        action = "warn" if self.on_loop == "warn" else (
            "rollback" if self.on_loop == "rollback" and self.rolled_back is None
            and self.spec.get("launcher") not in STATIC_WORLDS else "stop")
        self.loop_due.append((node, words, action))
        return event("loop", node, restarts=self.loops.after, action=action,
                     text="%s: %s%s" % (node, words, {
                         "warn": " (--on-loop warn: nothing done)",
                         "stop": ": stopping the run",
                         "rollback": ": every node restarts from the checkpoint before the "
                                     "newest"}[action]))

    def loop_act(self):
        """Act on the loops :meth:`loop_news` found (outside the judge's lock)."""
        with self.lock:
            due, self.loop_due = self.loop_due, []
        for node, words, action in due:
            if action == "stop":
                self.write(event("policy", node, action="stop",
                                 text="--on-loop stop: stopping the run (%s: %s)" % (node, words)))
                self.stop_nodes({n: {"state": "failed", "cause": {
                    "message": "stopped by --on-loop stop: %s: %s" % (node, words)}}
                    for n in self.view.nodes})
            elif action == "rollback":  # not on a node's line's thread: it reads the answers
                threading.Thread(target=self.rollback, args=(node, words), daemon=True).start()

    def loop_refuses(self, node):
        """Why the judge must not restart ``node`` now, or None: a resume mismatch stands (a
        restart would repeat it), or one more restart makes a loop (said, acted on)."""
        with self.lock:
            if self.loops.told:
                return self.loops.told
            if self.on_loop == "warn":
                return None
            words = self.loops.would_loop(node)
            if words is None:
                return None
            found = self.loops.failure(node)  # the restart it would be: not taken
            ev = self._loop_event(*found) if found is not None else None
        if ev is not None:
            self.write(ev)
            self.loop_act()
        return words

    def rollback(self, node, words):
        """--on-loop rollback: every node restarts, its ranks resuming from the checkpoint
        before the newest (the newest may be what breaks them). The step they resumed from
        in the loop goes with the restart (``resume_before``): the node writes it into its
        ``resume.json``, which the trainer's resume reads (docs/JUDGE.md)."""
        with self.lock:
            steps = [s for s in self.loops.last_resumed.values() if s is not None]
            before = max(steps) if steps else None
            self.rolled_back = before if before is not None else -1
            nodes = sorted(self.view.nodes)
            for n in nodes:
                self.loops.node(n).pending = True  # its `restarting`: this restart, counted
            self.loops.looped.discard(node)  # a loop again after it stops the run
        self.write(event("policy", node, action="rollback", resume_before=before,
                         text="--on-loop rollback: restarting every node from the checkpoint "
                         "before %s (%s: %s)" % ("step %d" % before if before is not None
                                                 else "the newest", node, words)))
        for n in nodes:  # as --on-hang restarts one: its old torchrun expelled too
            self.restart_node(n, {"resume_before": before if before is not None else "newest"},
                              "on-loop", "--on-loop rollback")

    def loop_verdict(self, rec):
        """A verdict's event with the resume mismatch that stands, as its cause."""
        if rec.get("what") == "verdict" and self.loops.told:
            rec = dict(rec, cause=self.loops.told,
                       text="%s; the cause: %s" % (rec.get("text"), self.loops.told))
        return rec
