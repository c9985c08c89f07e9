"""The run's judge's connections: the listener on the rendezvous address, each node's line
(what its supervisor forwards: the metas of its journal, its state.json) and a console's
requests (a fresh verdict, node surgery, a ping).

A part of the run's judge (agent/judge/judge.py), which mixes :class:`Listener` into its ``Judge``:
these methods work on the judge's view, lines, lock and journal (``self.view``,
``self.lines``, ``self.lock``, ``self.write``). Each node's supervisor connects through
agent/supervisor/judge_link.py after the token handshake (agent/wire/judge.py).

Standard library only; Python >= 3.9.
"""

import threading

from ..wire import judge as judge_wire
from ..rules.judge import event
from ..rules.notify import ASKED


MAX_HELLOS = 32  # connections at once that have not yet proved the token
MAX_PEERS = 64  # connections at once past the handshake, beyond two a node (a node's old and new)
ACCEPT_PAUSE = 0.1  # after accept() or a thread failed (no fds, no threads left): no busy loop


class Listener:
    """The judge's connections; mixed into ``Judge`` (agent/judge/judge.py)."""

    def serve(self, sock):
        """Accept connections until the judge stops: one thread each, at most
        :data:`MAX_HELLOS` of them in the handshake and :data:`MAX_PEERS` plus two a node past
        it; a connection beyond either is closed at once (a node tries again). Nothing a peer
        does, nor a thread that cannot start, ends this loop."""
        hellos = threading.BoundedSemaphore(MAX_HELLOS)
        peers = threading.BoundedSemaphore(MAX_PEERS + 2 * len(self.view.nodes))
        while not self.stop.is_set():
            try:
                conn, _peer = sock.accept()
            except OSError:
                if self.stop.is_set():
                    return
                self.stop.wait(ACCEPT_PAUSE)
                continue
            if not hellos.acquire(blocking=False):
                conn.close()
                continue
            if not peers.acquire(blocking=False):
                hellos.release()
                conn.close()
                continue
            try:
                threading.Thread(target=self._peer_slot, args=(conn, hellos, peers),
                                 name="judge-peer", daemon=True).start()
            except RuntimeError:  # can't start new thread: this one is refused, not the rest
                hellos.release()
                peers.release()
                conn.close()
                self.stop.wait(ACCEPT_PAUSE)

    def _peer_slot(self, conn, hellos, peers):
        try:
            self.peer(conn, hellos.release)
        finally:
            peers.release()

    def peer(self, conn, shook=None):
        """One connection: the handshake (``shook()`` once it is over, either way), then a
        node's line or a console's request."""
        try:
            line, node = judge_wire.accept_peer(conn, self.token)
        except (judge_wire.WireError, OSError):
            conn.close()
            return
        finally:
            if shook is not None:
                shook()
        if node.startswith("console:"):
            return self.console(line)
        if node not in self.view.nodes:
            line.close()
            return
        nl = judge_wire.NodeLine(node, line)
        with self.lock:
            old = self.lines.get(node)
            self.lines[node] = nl
            self.view.nodes[node].connected = True
        if old is not None:
            old.line.close()
        self.send_unsent_stop(node, nl)
        said = False  # a message the judge could not apply: one event a connection
        try:
            while True:
                msg = line.read()
                if msg is None:
                    break
                try:
                    self.from_node(nl, msg)
                except Exception as exc:  # its shape: dropped, said once, the line goes on
                    if not said:
                        said = True
                        self.write(event("judge_error", node, text=(
                            "a message from %s the judge could not apply (dropped): %r"
                            % (node, exc))[:600]))
        except judge_wire.WireError:
            pass
        finally:
            nl.fail_all("the connection to %s was lost" % node)
            with self.lock:
                if self.lines.get(node) is nl:
                    del self.lines[node]
                    if node in self.view.nodes:  # not when it was cordoned meanwhile
                        self.view.nodes[node].connected = False
            line.close()

    def from_node(self, nl, msg):
        kind = msg.get("t")
        if kind == "res":
            nl.answered(msg)
            return
        diverged = []
        with self.lock:
            if kind == "recs" and isinstance(msg.get("recs"), list):
                now = self.now()
                for meta in msg["recs"]:
                    if isinstance(meta, dict):
                        for ev in self.view.apply(nl.node, meta, now) + \
                                self.loop_news(nl.node, meta):
                            self.write(ev)
                            if ev.get("what") == "diverged":
                                diverged.append(ev)
                        self.figures.apply(nl.node, meta, self.view)  # --prometheus
                        self.goodput.add(nl.node, meta)  # agent/judge/goodput.py
            elif kind == "state":
                self.surgeon.node_state(nl.node, msg.get("state"))
                self.figures.apply_state(nl.node, msg.get("state"))
                for ev in self.view.apply_state(nl.node, msg.get("state"), self.now(),
                                                stopping=self.ending):
                    self.write(ev)
        if diverged and self.on_nan == "stop":
            self.act_on_nan(diverged[0])
        self.loop_act()  # --on-loop (agent/judge/loops.py)

    def console(self, line):
        """A console's request through the rendezvous host's agent: a fresh verdict now."""
        try:
            msg = line.read()
            if msg and not isinstance(msg.get("args") or {}, dict):
                raise judge_wire.WireError("a request whose args are not an object")
            if msg and msg.get("op") == "why":
                args = msg.get("args") if isinstance(msg.get("args"), dict) else {}
                # a read-only watcher's (agent/serve/server.py): no node signals its ranks
                verdict = self.take_verdict(reason=ASKED,
                                            signals=args.get("signals") is not False)
                line.send({"t": "res", "id": msg.get("id"), "ok": True, "data": verdict})
            elif msg and msg.get("op") == "cordon":
                line.send({"t": "res", "id": msg.get("id"), "ok": True,
                           "data": self.cordon(msg.get("args") or {})})
            elif msg and msg.get("op") == "ping":
                line.send({"t": "res", "id": msg.get("id"), "ok": True,
                           # over: a warm spare held for the run ends (agent/surgery/spare_hold.py)
                           "data": {"started": self.started, "on_hang": self.on_hang,
                                    "over": self.over is not None}})
        except judge_wire.WireError:
            pass
        finally:
            line.close()

    def cordon(self, args):
        """A console's node surgery (docs/SURGERY.md): ``out`` leaves the view (no rule, no
        --on-hang restart, no end waits for it), ``in`` (a spare) joins; the ``surgery``
        event (who, what, outcome) goes into this journal, which every console reads."""
        out, into = args.get("out"), args.get("in")
        left = []
        with self.lock:
            if isinstance(out, str) and out:
                left = [rs.rank for rs in self.view.ranks.values()
                        if rs.node == out and rs.state == "stalled"]
                self.view.cordon(out, into if isinstance(into, str) and into else None)
                self.ending.discard(out)
                self.unsent_stops.pop(out, None)
        for rank in left:  # consoles mark stalled ranks until the judge says otherwise
            self.write(event("stepping", out, rank, text="rank %d is no longer stalled on %s: "
                             "the node is out of the run" % (rank, out)))
        node = args.get("node") or out
        self.write(event("surgery", node if isinstance(node, str) else None,
                         who=str(args.get("who") or "")[:200],
                         action=str(args.get("action") or "cordon")[:40],
                         out=out if isinstance(out, str) else None,
                         text=str(args.get("text") or "node surgery")[:600],
                         **{"in": into if isinstance(into, str) else None}))
        return {"nodes": sorted(self.view.nodes)}
