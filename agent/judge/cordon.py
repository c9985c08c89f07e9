"""The judge's cordon policy, ``launch --auto-cordon`` (docs/SURGERY.md): a node proposed for
cordon (agent/rules/judge.py ``cordon_proposal``; agent/host/gpu_nvml.py's Xid and ECC errors) is
cordoned by the run's judge itself, with no console attached. The sequence is the one a
console's cordon drives (agent/rules/cordon.py); this module executes its steps on threads over
the judge's lines to the supervisors:

1. the node leaves the judge's view and the spare joins it (``Judge.cordon``,
   agent/judge/listen.py; the ``surgery`` event with who = ``judge``);
2. the node is fenced, then stopped, through its own supervisor's link (agent/supervisor/judge_link.py
   ``fence``: ``fenced.json`` first, then a stop); its last state says which processes
   survived the stop and whether GPU memory is still held by them;
3. the spare starts from the start spec the console left on this host at launch
   (agent/node/fence.py ``standby``, 0600): a spare on the judge's own host, which is the first
   spare unless the inventory names a ``store:`` host. Without one the run shrinks when
   ``--nnodes MIN:MAX`` leaves room, else nothing is done and a ``policy`` event says why.
   Meanwhile, as a console's cordon does, the node's dead torchrun is taken out of the
   rendezvous by the store beside this judge (agent/surgery/expel.py) and, when every rank of the
   run was stalled, the other nodes' workers are killed through their links
   (``drop_workers``): their torchruns rejoin at once;
4. the judge waits until the spare's ranks step in its view, or says the run shrank and why.

A node whose supervisor already ended (it ended failed) cannot be fenced from here: its last
state says what was left; the outcome says it was not fenced on its host, and a console that
attaches fences it (console/surgery/cordon.py ``follow_judge``).

Standard library only; Python >= 3.9.
"""

import os
import threading
import time

from ..surgery import expel
from ..wire import judge as judge_wire
from ..rules import cordon as sequence
from ..rules.judge import ENDED, all_stalled, event
from ..node.fence import FENCE, STANDBY, drop_standby, gpu_words
from ..node.ops import start
from ..wire.protocol import RequestError
from ..host.runfiles import read_json

WHO = "judge"
FENCE_WAIT = 180.0  # the fenced node's stop, confirmed in its last state
DROP_WAIT = 30.0  # another node's stalled workers killed (a kill and a look at /proc)
EXPEL_WAIT = 5.0  # the store's answer to a dead torchrun's expel (it polls every 0.1 s)
JOIN_EVERY = 0.5  # seconds between looks at the spare's ranks while it joins


def stalled_with(judge, node):
    """The run's other nodes connected to ``judge`` whose workers wait for hung ``node`` in a
    collective: every rank of the run is stalled (empty when any rank still steps, whose
    node's workers are left alone). Under the judge's lock."""
    if not all_stalled(judge.view.ranks.values()):
        return []
    return sorted(n for n in judge.lines if n != node and n in judge.view.nodes)


class AutoCordon:
    """``spec``: the judge's (``auto_cordon``, ``spares`` in the inventory's order,
    ``nnodes_min``, ``cordon_join_s``). ``judge``: the Judge it acts for (its lock, lines, view, write)."""

    def __init__(self, judge, spec):
        self.judge = judge
        self.on = bool(spec.get("auto_cordon"))
        self.spares = [s for s in spec.get("spares") or [] if isinstance(s, str)]
        low = spec.get("nnodes_min")
        self.nnodes_min = low if isinstance(low, int) and low > 0 else 1
        self.run_root = os.path.dirname(judge.jdir)
        self.busy = set()  # nodes cordoned (or being cordoned) by this policy
        self.ended = threading.Condition(judge.lock)
        self.last = {}  # node being fenced -> its last forwarded state
        # seconds the spare has to step once put in (``cordon_join_s``: a test's fake spare)
        wait = spec.get("cordon_join_s")
        self.join_wait = float(wait) if isinstance(wait, (int, float)) and wait > 0 \
            else sequence.JOIN_WAIT

    def consider(self, ev):
        """A ``cordon proposed`` event was journaled: cordon its node (once), on a thread of
        its own (it waits for the node's stop and the spare's start)."""
        node = ev.get("node")
        if not self.on or not isinstance(node, str) or node in self.busy:
            return
        self.busy.add(node)
        threading.Thread(target=self._cordon, args=(node, str(ev.get("reason") or "")),
                         daemon=True).start()

    def node_state(self, node, st):
        """A node's forwarded state.json (from the judge's link thread): the last one is what
        a fenced node's stop left, or what a node that ended on its own left."""
        if isinstance(st, dict):
            with self.ended:
                self.last[node] = st
                self.ended.notify_all()

    def forget(self):
        """The run is over (or the judge stops): the spares' kept specs go, secrets with them."""
        for name in self.spares:
            drop_standby(os.path.join(self.run_root, name))

    # -- the surgery -----------------------------------------------------------------------
    def spare_here(self):
        """The first spare this judge can start: its kept spec on this host, not fenced, not
        in the run."""
        for name in self.spares:
            ndir = os.path.join(self.run_root, name)
            if name not in self.judge.view.nodes and name not in self.busy and \
                    os.path.exists(os.path.join(ndir, STANDBY)) and \
                    not os.path.exists(os.path.join(ndir, FENCE)):
                return name
        return None

    def _cordon(self, node, reason):
        """The cordon sequence (agent/rules/cordon.py), its steps executed here on threads
        over the judge's lines, as a console executes them over its links."""
        judge = self.judge
        with judge.lock:
            if node not in judge.view.nodes:
                return  # out already (a console's cordon)
            active = len(judge.view.nodes)
            nl = judge.lines.get(node)
            spare = self.spare_here()
            ended = judge.view.nodes[node].ended
            stalled = stalled_with(judge, node)
            # hung: nothing of it can save, SIGKILL at once: the verdict names it, or its
            # ranks are all stalled (a console's cordon's rule, console/surgery/cordon.py)
            hung = reason.startswith("the verdict names") or all_stalled(
                [rs for rs in judge.view.ranks.values() if rs.node == node])
        if nl is None and not ended:
            judge.write(event("policy", node, action="none", text=(
                "--auto-cordon: %s not cordoned: it is not connected to the judge, so it "
                "cannot be fenced from here; `rankdeck cordon RUN --node %s` from a console"
                % (node, node))))
            return
        if spare is None and active - 1 < self.nnodes_min:
            judge.write(event("policy", node, action="none", text=(
                "--auto-cordon: %s not cordoned: no spare this judge can start (a spare on "
                "its host, launched with --auto-cordon) and --nnodes needs %d node(s); "
                "`rankdeck cordon RUN --node %s` from a console" % (node, self.nnodes_min, node))))
            return
        seq = sequence.Cordon(node, spare, shrink=spare is None, active_after=active - 1,
                              hung=hung, stalled=stalled,
                              ended=ended, wait=self.join_wait)
        what = seq.what()
        if spare:
            self.busy.add(spare)
        judge.write(event("policy", node, action="cordon",
                          text="--auto-cordon: %s (%s)" % (what, reason)))
        facts = {}
        while True:
            step, args = sequence.next_step(seq)
            if step == sequence.END:
                break
            if step == sequence.ANNOUNCE:
                judge.cordon({"out": node, "in": spare, "who": WHO, "action": "cordon",
                              "text": "%s: started by the judge (--auto-cordon)" % what})
                result = {}
            elif step == sequence.FENCE:
                began = time.monotonic()
                result = self._fence(node, nl, reason, args)
                facts = {"left": result.get("left") or [], "gpu": result.get("gpu"),
                         "fence_s": round(time.monotonic() - began, 2)}
            elif step == sequence.REPLACE:
                result = self._replace(node, args)
                facts["expelled"] = result["expelled"]
            else:
                result = self._join(args["spare"], args["wait"])
            seq.done(step, result)
        outcome, gpu = seq.outcome, facts.get("gpu")
        judge.write(event("surgery", node, who=WHO, action="outcome", out=node,
                          fenced=sequence.fenced(outcome), outcome=outcome,
                          left=facts.get("left", []), gpu=gpu, fence_s=facts.get("fence_s"),
                          expelled=facts.get("expelled", "not asked"),
                          text="%s: %s%s" % (what, outcome, "; GPU: %s" % gpu if gpu else ""),
                          **{"in": spare}))

    def _fence(self, node, nl, reason, args):
        """The ``fence`` step's result (agent/rules/cordon.py ``next_step``) for ``node``
        (connected to the judge, or ended: its last state says what was left)."""
        if args["ended"]:
            st = self.last.get(node) or {}
            left = st.get("left") if isinstance(st.get("left"), list) else []
            return {"ended": True, "left": left, "gpu": gpu_words(st.get("gpu"))
                    if not left else None}
        try:
            res = nl.request("fence", {"who": WHO, "why": "cordoned by the judge "
                                       "(--auto-cordon): %s" % reason, "grace": args["grace"]},
                             FENCE_WAIT)
        except judge_wire.WireError as exc:
            return {"error": str(exc)}
        try:
            member = expel.checked(res.get("member"))
        except ValueError:  # none (no c10d torchrun ran), or an older supervisor
            member = None
        deadline = time.monotonic() + FENCE_WAIT
        with self.ended:
            while not (self.last.get(node) or {}).get("state") in ENDED:
                if time.monotonic() >= deadline:
                    return {"unconfirmed": FENCE_WAIT}
                self.ended.wait(1.0)
            st = self.last[node]
        left = [p for p in st.get("left") or [] if isinstance(p, (int, list))] \
            if isinstance(st.get("left"), list) else []
        return {"left": left, "gpu": gpu_words(st.get("gpu")), "member": member}

    def _replace(self, node, args):
        """The ``replace`` step: the node's dead torchrun out of the rendezvous (the store runs
        beside this judge: agent/surgery/expel.py), the other nodes' stalled workers killed
        while the spare starts, as a console's cordon does (console/surgery/cordon.py)."""
        asked = expel.ask(self.run_root, args["expel"]) if args["expel"] else None
        dropping = [threading.Thread(target=self._drop_workers, args=(name, node), daemon=True)
                    for name in args["drop"]]
        for thread in dropping:
            thread.start()
        failed = self._start(args["spare"]) if args["spare"] else None
        expelled = self._expelled(asked)
        for thread in dropping:
            thread.join()
        return {"failed": failed, "expelled": expelled}

    def _join(self, spare, wait):
        """The ``join`` step: wait (``wait`` s at most) until the spare's ranks step in the
        judge's view (what its supervisor forwards)."""
        deadline = time.monotonic() + wait
        judge = self.judge
        while True:
            with judge.lock:
                ranks = list(judge.view.ranks.values())
                if sequence.spare_stepping(ranks, spare):
                    return {"stepping": True, "world": judge.view.world}
                nv = judge.view.nodes.get(spare)
                if time.monotonic() >= deadline:
                    return {"stepping": False, "world": judge.view.world,
                            "why": sequence.why_not_stepping(
                                ranks, spare, nv.state if nv else None,
                                (nv.phase or {}).get("name") if nv else None)}
            time.sleep(JOIN_EVERY)

    def _drop_workers(self, name, node):
        """SIGKILL ``name``'s workers, stalled with hung ``node``, through its link (its
        supervisor: agent/node/fence.py ``drop_workers``); its torchrun starts them again in the
        round that goes on without ``node``. One that cannot be asked fails in its collective."""
        with self.judge.lock:
            nl = self.judge.lines.get(name)
        try:
            if nl is None:
                raise judge_wire.WireError("%s is not connected to the judge" % name)
            res = nl.request("drop_workers", {}, DROP_WAIT)
        except judge_wire.WireError as exc:
            self.judge.write(event("policy", name, action="drop_workers", text=(
                "--auto-cordon: %s's workers, stalled with %s, were not killed (%s): they "
                "fail in their collective instead" % (name, node, exc))))
            return
        killed = [p for p in res.get("killed") or [] if isinstance(p, int)]
        if killed:
            self.judge.write(event("policy", name, action="drop_workers", killed=killed, text=(
                "--auto-cordon: %s's workers, stalled with %s, killed: its torchrun starts "
                "them again without %s" % (name, node, node))))

    def expel_dead(self, node, member):
        """``node``'s old torchrun, gone after the judge's restart (``member``: who it was in
        the rendezvous, from the node's link), taken out of the rendezvous by the store
        beside this judge: the new one's round need not wait for its entry to expire. What the
        store said (``done``, ``not done: why``), or None when nothing was asked."""
        try:
            member = expel.checked(member)
        except ValueError:  # none named (gone too late, no c10d torchrun, an older node)
            return None
        said = self._expelled(expel.ask(self.run_root, member))
        self.judge.write(event("policy", node, action="expel", text=(
            "%s's old torchrun %s" % (node, "taken out of the rendezvous at once"
                                      if said == "done" else "left to expire in the "
                                      "rendezvous (%s)" % said))))
        return said

    def _expelled(self, asked):
        """What the store said of request ``asked`` (None: nothing was asked)."""
        if asked is None:
            return "not asked"
        got = expel.answer(self.run_root, asked, EXPEL_WAIT)
        return "done" if got.get("expelled") is True else "not done: %s" % str(
            got.get("why"))[:200]

    def _start(self, spare):
        """None, or why ``spare`` (on this host) did not start from its kept spec."""
        spec = read_json(os.path.join(self.run_root, spare, STANDBY))
        if not isinstance(spec, dict):
            return "its start spec is not on the judge's host"
        try:
            start({"run_root": self.run_root, "node": spare, "spec": spec})
        except (RequestError, OSError) as exc:
            return str(exc)[:300]
        return None

