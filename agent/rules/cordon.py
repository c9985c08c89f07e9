"""The cordon sequence (docs/SURGERY.md), written once: its steps in order, what each step's
result says in words, and the surgery's outcome. Two executors drive it and only execute its
steps: a console's (console/surgery/cordon.py: ``rankdeck cordon``, the view's ``c``), async
over its links to the nodes, and the run's judge's (agent/judge/cordon.py: ``--auto-cordon``),
on threads over its lines to the supervisors. Each asks :func:`next_step` for the step to run,
runs it, and hands its result to :meth:`Cordon.done`, until the step is :data:`END`:

1. ``announce``: the run's judge hears of it (the node leaves its view, the spare joins) and
   writes the ``surgery`` event into its journal, which every console reads;
2. ``fence``: the node is fenced (``fenced.json`` first: no start or restart from anyone),
   stopped and checked (no process left, no GPU memory held); a hung node (its ranks all
   stalled, or the verdict names it) with no grace, SIGKILL at once;
3. ``replace``: at once and together, the spare starts torchrun for the same run and
   rendezvous, the node's dead torchrun is taken out of the rendezvous (``expel``), and,
   when every rank of the run was stalled, the other nodes' workers are killed
   (``drop``): their torchruns rejoin at once, in the round the spare joins;
4. ``join``: with a spare, the cordon waits until the spare's ranks step in the new world
   (every rank of it on the spare running, with a step). A spare that does not step within
   ``wait`` seconds is said: the outcome starts ``shrank:`` with the world the run went on
   with and why (the spare's node state and phase), never ``done``.

Outcomes: ``done``; ``done, not fenced`` (the judge: the node's supervisor had ended before,
nothing was left to stop; a console fences it later); ``shrank: ...``; ``failed: ...``.
Pure: no I/O, no threads. Standard library only; Python >= 3.9.
"""

ANNOUNCE, FENCE, REPLACE, JOIN, END = "announce", "fence", "replace", "join", "end"
STEPS = (ANNOUNCE, FENCE, REPLACE, JOIN)
JOIN_WAIT = 120.0  # seconds the spare has to step once put in (its round, its resume)
DONE, NOT_FENCED = "done", "done, not fenced"


class Cordon:
    """One cordon: ``node`` out; ``spare`` in (or None: the run shrinks to ``active_after``
    nodes when ``shrink``, else a node that is no member is fenced); ``hung``: nothing of the
    node can save (grace 0); ``stalled``: the other nodes whose workers wait for the hung node
    (every rank of the run stalled); ``ended``: the node's supervisor had ended before (only
    the judge can tell: a console fences through the node's host, which stops nothing then)."""

    def __init__(self, node, spare=None, shrink=False, active_after=0, hung=False,
                 stalled=(), ended=False, wait=JOIN_WAIT):
        self.node, self.spare, self.shrink = node, spare, bool(shrink)
        self.active_after, self.hung, self.ended = active_after, bool(hung), bool(ended)
        self.stalled = [n for n in stalled if n != node]
        self.wait = float(wait)
        self.results = {}  # step -> what it returned
        self.outcome = None  # the words, once the sequence ends

    def what(self):
        """The surgery in a few words (the ``surgery`` event's and the record's ``what``)."""
        return "cordon %s, %s" % (self.node, "spare %s in" % self.spare if self.spare else
                                  "the run shrinks to %d node(s)" % self.active_after
                                  if self.shrink else "a spare fenced")

    def done(self, step, result):
        """``step`` ran and returned ``result`` (a dict; see :func:`next_step`)."""
        self.results[step] = result if isinstance(result, dict) else {}

    def fence_words(self):
        """The fence step's outcome: ``done``, ``done, not fenced`` or ``failed: why``."""
        res = self.results.get(FENCE) or {}
        if res.get("error"):
            return "failed: %s could not be fenced: %s" % (self.node, res["error"])
        left = res.get("left") or []
        if res.get("ended"):  # (the judge) nothing to stop: its last state says what was left
            if not left:
                return NOT_FENCED
            return ("failed: %s ended with %d process(es) left, and cannot be fenced from "
                    "here; `rankdeck cordon` from a console" % (self.node, len(left)))
        if res.get("unconfirmed"):
            return ("failed: %s was fenced, but its stop was not confirmed within %.0f s"
                    % (self.node, res["unconfirmed"]))
        if left:
            return "failed: %d process(es) of %s still alive after the stop" % (
                len(left), self.node)
        gpu = str(res.get("gpu") or "")
        if gpu.startswith("held"):
            return "failed: %s stopped, but its GPU memory is %s" % (self.node, gpu)
        return DONE


def fenced(outcome):
    """The node carries its fence after a cordon that ended with ``outcome``: all but a fence
    that could not be asked or a node that had ended with processes left."""
    return not outcome.startswith("failed") or any(
        w in outcome for w in ("fenced, but", "still alive", "GPU memory"))


def next_step(c):
    """``(step, args)``: what to run next for cordon ``c``, or ``(END, {"outcome": words})``.

    ``announce`` args: ``out``, ``in``, ``text``; result: anything.
    ``fence`` args: ``grace`` (0 or None: the run's), ``ended``; result: ``error`` (it could
    not be asked), or ``left``, ``gpu`` (words), ``member`` (its torchrun in the rendezvous),
    ``ended`` (it had ended: nothing stopped), ``unconfirmed`` (seconds waited in vain).
    ``replace`` args: ``spare`` (or None), ``drop`` (nodes whose workers to kill), ``expel``
    (the member to take out, or None); result: ``failed`` (why the spare did not start, or
    None), ``expelled`` (words).
    ``join`` args: ``spare``, ``wait``; result: ``stepping`` (bool), ``world`` (the world
    size seen), ``why`` (the spare's state, when not stepping).
    """
    if ANNOUNCE not in c.results:
        return ANNOUNCE, {"out": c.node, "in": c.spare, "text": c.what()}
    if FENCE not in c.results:
        return FENCE, {"grace": 0 if c.hung else None, "ended": c.ended}
    fence = c.fence_words()
    if fence.startswith("failed"):
        return _end(c, fence)
    if REPLACE not in c.results:
        member = (c.results[FENCE] or {}).get("member") if fence == DONE else None
        return REPLACE, {"spare": c.spare, "drop": list(c.stalled) if fence == DONE else [],
                         "expel": member}
    failed = c.results[REPLACE].get("failed")
    if failed:
        return _end(c, "failed: %s fenced, but spare %s did not start: %s"
                    % (c.node, c.spare, failed))
    if c.spare and JOIN not in c.results:
        return JOIN, {"spare": c.spare, "wait": c.wait}
    join = c.results.get(JOIN)
    if join is not None and not join.get("stepping"):
        world = join.get("world")
        return _end(c, "shrank: %s fenced, but spare %s is not stepping after %.0f s%s: %s"
                    % (c.node, c.spare, c.wait, "; the run went on with world size %s" % world
                       if world else "", str(join.get("why") or "no rank of it seen")[:600]))
    return _end(c, fence)


def _end(c, words):
    c.outcome = words
    return END, {"outcome": words}


def spare_stepping(ranks, spare):
    """The spare's ranks step: it has ranks (``ranks``: objects with ``node``, ``state``,
    ``step``: the console's RankState, the judge's RankView), each running with a step."""
    mine = [r for r in ranks if r.node == spare]
    return bool(mine) and all(r.state == "running" and r.step is not None for r in mine)


def why_not_stepping(ranks, spare, node_state, phase=None):
    """Why the spare is not stepping yet, in words, for the ``shrank:`` outcome."""
    mine = sorted((r for r in ranks if r.node == spare), key=lambda r: r.rank)
    said = "%s is %s%s" % (spare, node_state or "unknown", "" if not phase else
                           " (%s)" % str(phase)[:120])
    if not mine:
        return said + ", with no rank in the run"
    return said + "; its ranks: " + ", ".join(
        "%d %s%s" % (r.rank, r.state, "" if r.step is None else " at step %s" % r.step)
        for r in mine[:8])
