"""Restart loops and their cause (plain data, no I/O, no threads): a node restarted again and
again that never passes the step it failed at, and ranks that resumed from different steps
after a restart.

The run's judge feeds a :class:`Loops` with what each node's supervisor forwards (agent/judge/
loops.py): ``file`` records (which rank a worker's file is: a new file is a new worker),
``metric`` records (steps), ``resumed`` records when a node forwards them
(agent/formats/resumed.py) and the supervisor's ``worker_failed`` and ``restarting`` events.

What counts as a restart (one count per failure of the node's workers):

* torchrun's own restart of its workers (``--max-restarts``): a ``worker_failed`` event, once
  per ``attempt`` (every rank of the failed worker group may report one);
* rankdeck's restart of the node (the judge's ``--on-hang restart``, a console's `restart`):
  the supervisor's ``restarting`` event (not a Slurm requeue's, which has a ``cause``), or the
  judge's own decision to restart it (:meth:`Loops.failure`), which the ``restarting`` that
  follows does not count again.

A failure is "at step S" when the node's ranks' newest step since the last failure was S - 1
(the step the ranks were in: a fault injected before step 120 fails at step 120). A failure
after which the node's ranks passed the step of the one before is progress: the count starts
again. ``after`` failures in a row after as many restarts, none passing the first's step, are
a loop: :func:`loop_words` says so.

Standard library only; Python >= 3.9.
"""

from .kinds import whole

DEFAULT_AFTER = 3  # restarts without progress before the loop is declared (launch --loop-restarts)
SHARED_HINT = "is the checkpoint folder shared by every node?"
KEPT_FAILURES = 64  # failures remembered per node (a loop needs `after` + 1 of them)
# a resume step read from a rank's first step is only as good as how often it prints one (the
# first after resuming from step 150 may be 151 or 160): so read, ranks that resumed this few
# steps apart are taken to agree (lockstep ranks that print every 10 steps, or only some do)
SLACK_STEPS = 50


class NodeLoop:
    """One node's failures since its ranks last made progress."""

    def __init__(self):
        self.reached = None  # newest step of its ranks since its last failure
        self.failed_at = []  # the step of each failure in a row with no progress between
        self.attempts = set()  # torchrun attempts whose worker failure was counted
        self.pending = False  # the judge counted a restart it asked for: its `restarting` is not new


class Loops:
    """Each node's failures in a row (for :func:`loop_words`) and, since the run's last
    restart, the step each rank resumed from (for :func:`resume_mismatch`)."""

    def __init__(self, after=DEFAULT_AFTER):
        self.after = int(after) if isinstance(after, int) and after >= 0 else DEFAULT_AFTER
        self.nodes = {}  # node -> NodeLoop
        self.files = {}  # (node, fid) -> rank
        self.fresh = set()  # (node, fid) of workers started since the run's last restart
        self.resumed = {}  # rank -> step it resumed from (None: from nothing) since then
        self.last_resumed = {}  # the same, of the restart before (what a loop resumed from)
        self.exact = set()  # ranks whose resume step is their resume line's, not a first step's
        self.told = None  # the mismatch words said for this restart (said once)
        self.looped = set()  # nodes whose loop was said (said once, until progress)

    def node(self, name):
        return self.nodes.setdefault(name, NodeLoop())

    # -- what a node forwards --------------------------------------------------------------
    def apply(self, node, meta):
        """One forwarded meta. Returns ``(node, words)`` when it makes a loop of ``node``'s
        failures, else None."""
        kind = meta.get("k")
        fid = meta.get("f")
        if kind == "file" and whole(meta.get("rank")) and whole(fid):
            if (node, fid) not in self.files:
                self.fresh.add((node, fid))
            self.files[(node, fid)] = meta["rank"]
        elif kind == "metric" and whole(meta.get("step")):
            nl = self.node(node)
            nl.reached = max(meta["step"], nl.reached or 0)
            if nl.failed_at and nl.reached >= nl.failed_at[-1]:
                nl.failed_at = []  # it passed the step it failed at: progress
                self.looped.discard(node)
            rank = self.files.get((node, fid))
            if rank is not None and (node, fid) in self.fresh and rank not in self.resumed:
                # no resume line before its first step: from the step before it, or nothing
                self.resumed[rank] = meta["step"] - 1 if meta["step"] > 1 else None
                self.exact.discard(rank)
        elif kind == "resumed":
            rank = self.files.get((node, fid))
            step = meta.get("step")
            if rank is not None and (node, fid) in self.fresh and whole(step):
                self.resumed[rank] = step or None
                self.exact.add(rank)
        elif kind == "event" and meta.get("what") == "worker_failed":
            nl = self.node(node)
            attempt = meta.get("attempt")
            if whole(attempt):
                if attempt in nl.attempts:
                    return None
                nl.attempts.add(attempt)
            return self.failure(node)
        elif kind == "event" and meta.get("what") == "launched":
            self.node(node).attempts = set()  # a new torchrun counts its attempts from 0
        elif kind == "event" and meta.get("what") == "restarting" and not meta.get("cause"):
            # (one with a cause is a Slurm job's requeue, agent/slurm/job.py: no failure)
            nl = self.node(node)
            if nl.pending:
                nl.pending = False
                return None
            return self.failure(node)
        return None

    def failure(self, node, judge=False):
        """``node``'s workers failed and are restarted (``judge``: the judge restarts it, its
        ``restarting`` event is this failure). Returns ``(node, words)`` once its failures make
        a loop."""
        nl = self.node(node)
        nl.pending = nl.pending or judge
        at = nl.reached + 1 if nl.reached is not None else (
            nl.failed_at[-1] if nl.failed_at else None)
        nl.failed_at = (nl.failed_at + [at])[-KEPT_FAILURES:]
        nl.reached = None
        self.restart()
        if self.after and len(nl.failed_at) > self.after and node not in self.looped:
            self.looped.add(node)
            return node, loop_words(nl.failed_at[-self.after:])
        return None

    def would_loop(self, node):
        """The words of the loop one more failure of ``node`` (a restart the judge is about
        to ask for) would make, or None."""
        nl = self.node(node)
        at = nl.reached + 1 if nl.reached is not None else (
            nl.failed_at[-1] if nl.failed_at else None)
        failed = nl.failed_at + [at]
        if self.after and len(failed) > self.after:
            return loop_words(failed[-self.after:])
        return None

    def restart(self):
        """The run's ranks start again: what they resume from is looked at anew."""
        if self.resumed:
            self.last_resumed = self.resumed
        self.fresh = set()
        self.resumed = {}
        self.exact = set()
        self.told = None

    def mismatch(self, ranks):
        """The words of :func:`resume_mismatch` for ``ranks`` (every rank the run has), once
        per restart, when each of them has said what it resumed from; else None. Steps read
        from first steps (no resume line) less than :data:`SLACK_STEPS` apart agree."""
        if self.told is not None or not ranks or any(r not in self.resumed for r in ranks):
            return None
        steps = [self.resumed[r] or 0 for r in ranks]
        if not all(r in self.exact for r in ranks) and max(steps) - min(steps) < SLACK_STEPS:
            return None  # read from first steps, this close: as good as agreeing
        words = resume_mismatch({r: self.resumed[r] for r in ranks})
        if words:
            self.told = words
        return words


def loop_words(failed_at):
    """``no progress in 3 restarts: each failed at step 120`` for the steps of the failures
    after those restarts (None: a step not known)."""
    n = len(failed_at)
    steps = [s for s in failed_at if s is not None]
    head = "no progress in %d restart%s" % (n, "" if n == 1 else "s")
    if not steps:
        return head + ": each failed before any step"
    if len(set(steps)) == 1 and len(steps) == n:
        return "%s: each failed at step %d" % (head, steps[0])
    return "%s: each failed by step %d (steps %s)" % (
        head, max(steps), ", ".join("?" if s is None else str(s) for s in failed_at))


def resume_mismatch(resumed):
    """``rank 0 resumed from step 150, ranks 1-3 from none: is the checkpoint folder shared by
    every node?`` for ``resumed`` ({rank: step or None}) whose ranks resumed from different
    steps; None when they agree."""
    groups = {}
    for rank, step in resumed.items():
        groups.setdefault(step, []).append(rank)
    if len(groups) < 2:
        return None
    order = sorted(groups, key=lambda s: (s is None, -(s or 0)))
    parts = []
    for i, step in enumerate(order):
        ranks = sorted(groups[step])
        what = "none" if step is None else "step %d" % step
        parts.append("%s %s%s" % (rank_list(ranks), "resumed from " if i == 0 else "from ",
                                  what))
    return "%s: %s" % (", ".join(parts), SHARED_HINT)


def rank_list(ranks):
    """``rank 0``, ``ranks 1-3``, ``ranks 0, 2, 5-7`` (at most 8 runs, then ``...``)."""
    runs = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    words = ["%d" % a if a == b else "%d-%d" % (a, b) for a, b in runs]
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(words)
