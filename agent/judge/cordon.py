"""The judge's cordon policy, ``launch --auto-cordon`` (docs/SURGERY.md): a node proposed for
cordon (agent/rules/judge.py ``cordon_proposal``; agent/host/gpu_nvml.py's Xid and ECC errors) is
cordoned by the run's judge itself, with no console attached, in a console's order:

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
   (``drop_workers``): their torchruns rejoin at once.

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
from ..rules.judge import ENDED, all_stalled, event
from ..node.fence import FENCE, STANDBY, drop_standby, gpu_words
from ..node.ops import start
from ..wire.protocol import RequestError
from ..host.runfiles import read_json

WHO = "judge"
FENCE_WAIT = 180.0  # the fenced node's stop, confirmed in its last state
DROP_WAIT = 30.0  # another node's stalled workers killed (a kill and a look at /proc)
EXPEL_WAIT = 5.0  # the store's answer to a dead torchrun's expel (it polls every 0.1 s)


def stalled_with(judge, node):
    """The run's other nodes connected to ``judge`` whose workers wait for hung ``node`` in a
    collective: every rank of the run is stalled (empty when any rank still steps, whose
    node's workers are left alone). Under the judge's lock."""
    if not all_stalled(judge.view.ranks.values()):
        return []
    return sorted(n for n in judge.lines if n != node and n in judge.view.nodes)


class AutoCordon:
    """``spec``: the judge's (``auto_cordon``, ``spares`` in the inventory's order,
    ``nnodes_min``). ``judge``: the Judge it acts for (its lock, lines, view, write)."""

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
        judge = self.judge
        with judge.lock:
            if node not in judge.view.nodes:
                return  # out already (a console's cordon)
            active = len(judge.view.nodes)
            nl = judge.lines.get(node)
            spare = self.spare_here()
            gone = (judge.view.nodes[node].ended, self.last.get(node))
            stalled = stalled_with(judge, node)
        if nl is None and not gone[0]:
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
        what = "cordon %s, %s" % (node, "spare %s in" % spare if spare else
                                  "the run shrinks to %d node(s)" % (active - 1))
        if spare:
            self.busy.add(spare)
        judge.write(event("policy", node, action="cordon",
                          text="--auto-cordon: %s (%s)" % (what, reason)))
        judge.cordon({"out": node, "in": spare, "who": WHO, "action": "cordon",
                      "text": "%s: started by the judge (--auto-cordon)" % what})
        began = time.monotonic()
        outcome, left, gpu, member = self._fence(node, nl, reason, gone[0])
        fence_s = round(time.monotonic() - began, 2)
        # its dead torchrun out of the rendezvous: the next round does not wait for its
        # entry to expire (the store runs beside this judge: agent/surgery/expel.py)
        asked = expel.ask(self.run_root, member) if outcome == "done" and member else None
        # the other nodes' stalled workers killed while the spare starts, as a console's
        # cordon does (console/surgery/cordon.py drop_workers): their torchruns rejoin at once
        dropping = [threading.Thread(target=self._drop_workers, args=(name, node), daemon=True)
                    for name in (stalled if outcome == "done" else [])]
        for thread in dropping:
            thread.start()
        if outcome in ("done", "done, not fenced") and spare:
            failed = self._start(spare)
            if failed:
                outcome = "failed: %s fenced, but spare %s did not start: %s" % (
                    node, spare, failed)
        expelled = self._expelled(asked)
        for thread in dropping:
            thread.join()
        fenced = not outcome.startswith("failed") or "fenced, but" in outcome \
            or "still alive" in outcome or "GPU memory" in outcome
        judge.write(event("surgery", node, who=WHO, action="outcome", out=node, fenced=fenced,
                          outcome=outcome, left=left, gpu=gpu, fence_s=fence_s,
                          expelled=expelled,
                          text="%s: %s%s" % (what, outcome, "; GPU: %s" % gpu if gpu else ""),
                          **{"in": spare}))

    def _fence(self, node, nl, reason, ended):
        """(outcome, left, gpu, member) of fencing ``node`` (connected to the judge, or
        ended): ``done``, ``done, not fenced`` (its supervisor had ended: nothing to stop,
        nothing left) or ``failed: why``; ``member``: its torchrun in the rendezvous, checked
        (agent/surgery/expel.py), or None."""
        if ended:
            st = self.last.get(node) or {}
            left = st.get("left") if isinstance(st.get("left"), list) else []
            if not left:
                return "done, not fenced", [], gpu_words(st.get("gpu")), None
            return ("failed: %s ended with %d process(es) left, and cannot be fenced from "
                    "here; `rankdeck cordon` from a console" % (node, len(left))), left, None, \
                None
        try:
            # a node a verdict names is hung: nothing of it can save, SIGKILL at once
            res = nl.request("fence", {"who": WHO, "why": "cordoned by the judge "
                                       "(--auto-cordon): %s" % reason, "grace": 0 if
                                       reason.startswith("the verdict names") else None},
                             FENCE_WAIT)
        except judge_wire.WireError as exc:
            return "failed: %s could not be fenced: %s" % (node, exc), [], None, None
        try:
            member = expel.checked(res.get("member"))
        except ValueError:  # none (no c10d torchrun ran), or an older supervisor
            member = None
        deadline = time.monotonic() + FENCE_WAIT
        with self.ended:
            while not (self.last.get(node) or {}).get("state") in ENDED:
                if time.monotonic() >= deadline:
                    return ("failed: %s was fenced, but its stop was not confirmed within "
                            "%.0f s" % (node, FENCE_WAIT)), [], None, None
                self.ended.wait(1.0)
            st = self.last[node]
        left = [p for p in st.get("left") or [] if isinstance(p, (int, list))] \
            if isinstance(st.get("left"), list) else []
        gpu = gpu_words(st.get("gpu"))
        if left:
            return "failed: %d process(es) of %s still alive after the stop" % (
                len(left), node), left, gpu, None
        if gpu.startswith("held"):
            return "failed: %s: GPU memory %s" % (node, gpu), left, gpu, None
        return "done", left, gpu, member

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

