"""The policies the user turned on, as the run's judge acts on them through its lines to the
nodes: ``on_hang`` (restart the node the verdict names within the restart budget, a static
world's every node on a fresh store, or stop the run), ``on_nan`` (stop the run at a rank's
first inf or NaN loss), the stops of ``max_wall`` and of the run's ends, and the cordon
proposal handed to ``--auto-cordon`` (agent/judge/cordon.py).

A part of the run's judge (agent/judge/judge.py), which mixes :class:`Policies` into its ``Judge``:
these methods work on the judge's view, lines, lock and journal (``self.view``,
``self.lines``, ``self.lock``, ``self.write``) and its spec and restart budget.

Standard library only; Python >= 3.9.
"""

import os
import threading
import time

from ..wire import judge as judge_wire
from ..rules.judge import event
from ..surgery.static_world import STATIC_WORLDS

ACTION_TIMEOUT = 180.0
LOG_TIMEOUT = 30.0  # a line written in the node's action log


def log_expel(nl, member, expelled, asked):
    """The judge's expel of a restarted node's old torchrun (``member``; ``expelled``: what the
    store said, at ``asked``) kept in that node's action log, through its link
    (agent/supervisor/judge_link.py ``log_expel``): the judge's own host may run no node of the
    run, and the node it was done for is where a console's `rankdeck actions` reads it. A node
    whose supervisor is older (it answers ``unknown request``) or gone keeps none; the judge's
    journal has it either way."""
    try:
        nl.request("log_expel", {"pid": member.get("pid"), "at": asked,
                                 "expelled": expelled == "done",
                                 "why": expelled[len("not done: "):] if expelled != "done"
                                 else None}, LOG_TIMEOUT)
    except judge_wire.WireError:
        pass


class Policies:
    """The judge's policies; mixed into ``Judge`` (agent/judge/judge.py)."""

    def propose_cordon(self, ev):
        """A ``cordon proposed`` event was just journaled (agent/rules/judge.py
        cordon_proposal: the node is in trouble again soon after its restart; a GPU's Xid or
        ECC error). Consoles show it and ``--notify`` forwards it; with ``--auto-cordon`` the
        judge cordons the node itself (agent/judge/cordon.py), on a thread of its own: this
        runs on the thread that journaled the event, which must not block."""
        self.surgeon.consider(ev)

    def act_on_hang(self, verdict):
        nodes = sorted({s.get("node") for s in verdict.get("suspects") or []
                        if isinstance(s.get("node"), str)})
        who = ", ".join("rank %s on %s" % (s.get("rank"), s.get("node"))
                        for s in verdict.get("suspects") or [])
        if self.on_hang == "stop":
            self.write(event("policy", None, action="stop",
                             text="--on-hang stop: stopping the run (the verdict names %s)"
                             % who))
            self.stop_nodes({n: {"state": "failed", "cause": {
                "message": "stopped by --on-hang stop: %s" % verdict.get("summary"),
                "named": n in nodes}}  # the host's record (agent/rules/fleet.py)
                for n in self.view.nodes})
            return
        if self.spec.get("launcher") in STATIC_WORLDS:
            return self.restart_world(who)
        for node in nodes:
            used = self.restarts.get(node, 0)
            refused = self.loop_refuses(node)  # agent/judge/loops.py
            if refused:
                self.write(event("policy", node, action="none", cause=refused,
                                 text="--on-hang restart: %s not restarted: %s" % (node, refused)))
                continue
            if used >= self.max_restarts:
                self.write(event("policy", node, action="none",
                                 text="--on-hang restart: %s not restarted, its restart budget "
                                 "(%d) is spent" % (node, self.max_restarts)))
                continue
            self.restarts[node] = used + 1
            self.write(event("policy", node, action="restart",
                             text="--on-hang restart: restarting %s (the verdict names %s; "
                             "restart %d of %d)" % (node, who, used + 1, self.max_restarts)))
            # ``named``: the node's host keeps it in its record (agent/host/fleet.py)
            self.restart_node(node, {"named": str(verdict.get("summary") or "")[:300]},
                              "on-hang", "--on-hang restart")

    def restart_node(self, node, args, reason, words):
        """The judge's restart of one node (``args``: the restart's), written once for each
        policy that restarts one: through the node's line (the door serve's restart goes
        through, agent/node/door.py), then its old torchrun taken out of the rendezvous and
        that kept in the node's action log, then said (``restarted``, or the failure)."""
        try:
            with self.lock:
                nl = self.lines.get(node)
            if nl is None:
                raise judge_wire.WireError("%s is not connected to the judge" % node)
            said = nl.request("restart", args, ACTION_TIMEOUT)
            asked = time.time()
            member = said.get("member")
            expelled = self.surgeon.expel_dead(node, member)  # its old torchrun
            if expelled is not None:
                log_expel(nl, member, expelled, asked)
            self.write(event("restarted", node, reason=reason,
                             text="%s restarted by the judge (%s)" % (node, words)))
        except judge_wire.WireError as exc:
            self.write(event("policy", node, action="failed",
                             text="%s of %s failed: %s" % (words, node, exc)))

    def restart_world(self, who):
        """--on-hang restart of a static world (DeepSpeed's launcher): every node restarts
        on a fresh store (agent/surgery/static_world.py); one restart out of every node's budget."""
        nodes = sorted(self.view.nodes)
        used = max([self.restarts.get(n, 0) for n in nodes] or [0])
        if used >= self.max_restarts:
            self.write(event("policy", None, action="none", text="--on-hang restart: not "
                             "restarted, the restart budget (%d) is spent" % self.max_restarts))
            return
        self.restarts.update((n, used + 1) for n in nodes)
        self.write(event("policy", None, action="restart", text="--on-hang restart: %s: "
                         "every node restarts (the verdict names %s; restart %d of %d)"
                         % (STATIC_WORLDS[self.spec["launcher"]], who, used + 1,
                            self.max_restarts)))
        from ..store.tcpstore import fresh_store  # here, as in agent/judge/judge.py main: only the judge needs it
        try:  # beside the store: a new store process, a new port, none of the old keys
            port = fresh_store(os.path.dirname(self.jdir), self.spec["addr"], None)["port"]
        except RuntimeError as exc:
            return self.write(event("policy", None, action="failed", text="--on-hang restart "
                                    "failed: the store did not start again: %s" % exc))
        failed = {}

        def one(node):
            try:
                with self.lock:
                    nl = self.lines.get(node)
                if nl is None:
                    raise judge_wire.WireError("%s is not connected to the judge" % node)
                nl.request("restart", {"master_port": port}, ACTION_TIMEOUT)
            except judge_wire.WireError as exc:
                failed[node] = str(exc)
        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.write(event("policy", None, action="failed", text="--on-hang restart failed: " +
                         "; ".join(failed.values())) if failed else
                   event("restarted", None, reason="on-hang", text="every node restarted by "
                         "the judge (--on-hang restart), master port %d" % port))

    def act_on_nan(self, ev):
        """--on-nan stop: a rank's loss went inf or NaN; stop every node (once), each saving
        what its ranks printed to the end (the supervisor's stop drains their files)."""
        with self.lock:
            if self.ending.issuperset(self.view.nodes):
                return
        where = "rank %s on %s diverged at step %s" % (ev.get("rank"), ev.get("node"),
                                                        ev.get("step"))
        self.write(event("policy", ev.get("node"), ev.get("rank"), action="stop",
                         step=ev.get("step"), text="--on-nan stop: stopping the run (%s)" % where))
        self.stop_nodes({n: {"state": "stopped", "cause": {
            "message": "stopped by --on-nan stop: %s" % where, "rank": ev.get("rank")}}
            for n in self.view.nodes})

    def stop_nodes(self, ends):
        """Stop each node of ``ends`` ({node: {"state", "cause"}}) once, in parallel. A node
        not connected now (not yet, or its line was lost) is sent its stop when it connects
        (agent/judge/listen.py calls :meth:`send_unsent_stop`): before, a ``--max-wall``
        reached before every node had connected stopped only the connected ones."""
        todo = {n: e for n, e in ends.items() if n not in self.ending}
        self.ending.update(todo)
        for node, end in todo.items():
            self._send_stop(node, end)

    def _send_stop(self, node, end):
        with self.lock:
            nl = self.lines.get(node)
            if nl is None:
                self.unsent_stops[node] = end
                return
        threading.Thread(target=self._stop_one, args=(node, nl, end), daemon=True).start()

    def send_unsent_stop(self, node, nl):
        """A stop decided while ``node`` had no line, sent on its new line ``nl``."""
        with self.lock:
            end = self.unsent_stops.pop(node, None)
        if end is not None:
            threading.Thread(target=self._stop_one, args=(node, nl, end), daemon=True).start()

    def _stop_one(self, node, nl, end):
        try:
            nl.request("stop", {"end": end}, ACTION_TIMEOUT)
        except judge_wire.WireError:
            # the node's own journal says how it ended and the run's end is seen by
            # Judge.tick; a line lost before the answer: sent again when the node connects
            with self.lock:
                lost = self.lines.get(node) is not nl and node in self.ending
            if lost:
                self._send_stop(node, end)
