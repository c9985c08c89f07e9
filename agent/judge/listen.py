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


class Listener:
    """The judge's connections; mixed into ``Judge`` (agent/judge/judge.py)."""

    def serve(self, sock):
        while not self.stop.is_set():
            try:
                conn, _peer = sock.accept()
            except OSError:
                if self.stop.is_set():
                    return
                continue
            threading.Thread(target=self.peer, args=(conn,), daemon=True).start()

    def peer(self, conn):
        try:
            line, node = judge_wire.accept_peer(conn, self.token)
        except (judge_wire.WireError, OSError):
            conn.close()
            return
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
        try:
            while True:
                msg = line.read()
                if msg is None:
                    break
                self.from_node(nl, msg)
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
                        for ev in self.view.apply(nl.node, meta, now):
                            self.write(ev)
                            if ev.get("what") == "diverged":
                                diverged.append(ev)
            elif kind == "state":
                self.surgeon.node_state(nl.node, msg.get("state"))
                for ev in self.view.apply_state(nl.node, msg.get("state"), self.now(),
                                                stopping=self.ending):
                    self.write(ev)
        if diverged and self.on_nan == "stop":
            self.act_on_nan(diverged[0])

    def console(self, line):
        """A console's request through the rendezvous host's agent: a fresh verdict now."""
        try:
            msg = line.read()
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
