"""The run's judge: one process per run, on the rendezvous host, that applies the run's rules
whether or not a console is attached, and writes what it decides into its own journal.

Why here: the judge must live as long as the run and be reachable by every node, and the
rendezvous host is where the run already depends on a process of its own (the store,
agent/store.py); a judge that dies with that host dies with a run that could not go on
anyway (docs/DESIGN-NOTES.md, "The judge", lists the failure cases).

How: it listens on the rendezvous address (agent/judge_wire.py: a token handshake); each
node's supervisor connects (agent/judge_link.py) and forwards the metas of its journal and
its state.json; the judge keeps a RunView (agent/judge_view.py) and every second applies the
rules (agent/judge_rules.py): stalls (also of a run whose ranks print no steps, from their CPU), the verdict when a
stall starts and again while it lasts (it asks every node for its ranks' stacks and
flight-recorder tails, twice, and decides with agent/verdict.py), a rendezvous that waits and
for whom, nodes whose torchrun waits for what cannot come, the run's end, a node in trouble
again soon after its restart (``cordon proposed``). Policies the user turned on act
here (``on_hang``: restart the node the verdict names within the restart budget, or stop the
run; ``on_nan``: stop the run at a rank's first inf or NaN loss; ``max_wall``; the cordon
policy to come acts in :meth:`Judge.propose_cordon`); ``notify``
runs a command for the events the user picked (agent/judge_notify.py). Every decision is an event in ``<run_root>/judge/journal``, which a
console reads as it reads a node's (docs/PROTOCOL.md "The judge").

Over 450 lines: the policies (a static world's restart among them) act through the judge's
lines to the nodes and its journal, which they share with the rules; the rules are apart.

Standard library only; Python >= 3.9. ``python -m agent judge RUN_ROOT`` with its spec (token,
settings, secrets) on stdin, as the supervisor takes its spec.
"""

import json
import os
import signal
import sys
import threading
import time

from . import judge_notify, judge_wire, procs
from .judge_cordon import AutoCordon
from .journal import JournalWriter
from .judge_rules import (CORDON_WITHIN_S, RULES, check_stalls, check_waiting, ends_due, event,
                          run_over, stalled, verdict_again_due, verdict_proposals)
from .judge_view import RunView
from .judge_control import judge_dir
from .mask import Masker
from .runfiles import write_json_atomic
from .slurm_job import release_job
from .static_world import STATIC_WORLDS
from .verdict import decide

TICK = 1.0
WHY_TIMEOUT = 20.0
SAMPLE_GAP = 1.0
ACTION_TIMEOUT = 180.0
SETTLE = 5.0  # after the run ended: the last events reach the journal, then the judge ends
ALONE_END = 300.0  # no supervisor connected for this long (from the start, too): the judge ends


class Judge:
    def __init__(self, spec, jdir):
        self.spec = spec
        self.jdir = jdir
        self.token = spec["token"]
        cordon_within = spec.get("cordon_within_s", CORDON_WITHIN_S)
        self.view = RunView(spec["nodes"], spec.get("stall_after", 60.0),
                            cordon_within if isinstance(cordon_within, (int, float)) else 0)
        self.on_hang = spec.get("on_hang") or "warn"
        self.on_nan = spec.get("on_nan") or "warn"  # stop: the run, at a first inf/NaN loss
        self.max_wall = spec.get("max_wall")
        self.max_restarts = int(spec.get("max_restarts") or 0)
        self.restarts = {}  # node -> restarts the judge asked for
        self.masker = Masker(spec.get("secrets") or [])
        self.notifier = judge_notify.Notifier(spec.get("notify"), spec.get("notify_on"),
                                              self.masker, self.write)
        self.lock = threading.RLock()
        self.lines = {}  # node -> NodeLine
        self.journal = JournalWriter(os.path.join(jdir, "journal"))
        self.started = time.time()
        self.clock0 = time.monotonic()
        self.verdict_running = False
        self.ending = set()  # nodes the judge is stopping
        self.over = None
        self.stop = threading.Event()
        self.surgeon = AutoCordon(self, spec)  # --auto-cordon (agent/judge_cordon.py)

    # -- the journal -----------------------------------------------------------------------
    def write(self, rec):
        # every string: a waiting event's phases carry notes from torchrun's own records
        rec = self.masker.mask_tree(dict(rec, ts=time.time()))
        with self.lock:
            self.journal.append(rec)
        self.notifier.consider(rec)
        if rec.get("what") == "cordon proposed":
            self.propose_cordon(rec)

    def now(self):
        return time.monotonic() - self.clock0

    # -- connections -----------------------------------------------------------------------
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
                verdict = self.take_verdict(reason=judge_notify.ASKED)
                line.send({"t": "res", "id": msg.get("id"), "ok": True, "data": verdict})
            elif msg and msg.get("op") == "cordon":
                line.send({"t": "res", "id": msg.get("id"), "ok": True,
                           "data": self.cordon(msg.get("args") or {})})
            elif msg and msg.get("op") == "ping":
                line.send({"t": "res", "id": msg.get("id"), "ok": True,
                           # over: a warm spare held for the run ends (agent/spare_hold.py)
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

    # -- asking the nodes ------------------------------------------------------------------
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

    def _sample(self, unanswered=None):
        """(reports, {node: cause}); the nodes in ``unanswered`` (an earlier sample's) are not
        asked again: each would cost another WHY_TIMEOUT of the same silence."""
        reports, unreachable = [], dict(unanswered or {})
        for node, res in self.ask_all("why", {}, WHY_TIMEOUT, skip=unreachable).items():
            if isinstance(res, Exception):
                unreachable[node] = str(res)[:200]
                continue
            for r in res.get("ranks") or []:
                if isinstance(r, dict) and isinstance(r.get("rank"), int):
                    reports.append(dict(r, node=node))
        return reports, unreachable

    def take_verdict(self, reason):
        """Two samples of every node's ranks, one verdict; journaled, and acted on."""
        earlier, unanswered = self._sample()
        time.sleep(SAMPLE_GAP)
        reports, unreachable = self._sample(unanswered)
        with self.lock:
            expected = self.view.alive_ranks()
        verdict = decide(reports, unreachable, expected, earlier=earlier)
        verdict = self.masker.mask_tree(verdict)
        with self.lock:
            self.view.verdict = verdict
            self.view.verdict_at = self.now()
            # a hang again: a verdict on a stall (not one a console asked for meanwhile)
            proposals = [] if reason == judge_notify.ASKED else \
                verdict_proposals(self.view, verdict, self.now())
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

    # -- policies --------------------------------------------------------------------------
    def propose_cordon(self, ev):
        """A ``cordon proposed`` event was just journaled (agent/judge_rules.py
        cordon_proposal: the node is in trouble again soon after its restart; a GPU's Xid or
        ECC error). Consoles show it and ``--notify`` forwards it; with ``--auto-cordon`` the
        judge cordons the node itself (agent/judge_cordon.py), on a thread of its own: this
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
                "message": "stopped by --on-hang stop: %s" % verdict.get("summary")}}
                for n in self.view.nodes})
            return
        if self.spec.get("launcher") in STATIC_WORLDS:
            return self.restart_world(who)
        for node in nodes:
            used = self.restarts.get(node, 0)
            if used >= self.max_restarts:
                self.write(event("policy", node, action="none",
                                 text="--on-hang restart: %s not restarted, its restart budget "
                                 "(%d) is spent" % (node, self.max_restarts)))
                continue
            self.restarts[node] = used + 1
            self.write(event("policy", node, action="restart",
                             text="--on-hang restart: restarting %s (the verdict names %s; "
                             "restart %d of %d)" % (node, who, used + 1, self.max_restarts)))
            try:
                with self.lock:
                    nl = self.lines.get(node)
                if nl is None:
                    raise judge_wire.WireError("%s is not connected to the judge" % node)
                said = nl.request("restart", {}, ACTION_TIMEOUT)
                self.surgeon.expel_dead(node, said.get("member"))  # its old torchrun
                self.write(event("restarted", node, reason="on-hang",
                                 text="%s restarted by the judge (--on-hang restart)" % node))
            except judge_wire.WireError as exc:
                self.write(event("policy", node, action="failed",
                                 text="--on-hang restart of %s failed: %s" % (node, exc)))

    def restart_world(self, who):
        """--on-hang restart of a static world (DeepSpeed's launcher): every node restarts
        on a fresh store (agent/static_world.py); one restart out of every node's budget."""
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
        from .store import fresh_store  # here, as in main: only the judge process needs it
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
        """Stop each node of ``ends`` ({node: {"state", "cause"}}) once, in parallel."""
        todo = {n: e for n, e in ends.items() if n not in self.ending}
        self.ending.update(todo)
        for node, end in todo.items():
            with self.lock:
                nl = self.lines.get(node)
            if nl is not None:
                threading.Thread(target=self._stop_one, args=(nl, end), daemon=True).start()

    def _stop_one(self, nl, end):
        try:
            nl.request("stop", {"end": end}, ACTION_TIMEOUT)
        except judge_wire.WireError:
            pass  # the node's own journal says how it ended; the run's end is seen below

    # -- the rules, every second -----------------------------------------------------------
    def tick(self):
        now = self.now()
        with self.lock:
            news = check_stalls(self.view, now) + check_waiting(self.view, now)
            start_verdict = any(e["what"] == "stalled" for e in news) and \
                not self.verdict_running
            again = not self.verdict_running and verdict_again_due(self.view, now)
            if start_verdict or again:
                self.verdict_running = True
            ends = ends_due(self.view)
            over = run_over(self.view) if self.over is None else None
        for ev in news:
            self.write(ev)
        if start_verdict or again:
            reason = "a stall began" if start_verdict else "the stall goes on"
            threading.Thread(target=self._verdict_then_act, args=(reason,), daemon=True).start()
        if ends:
            for node, end in ends.items():
                if node not in self.ending:
                    self.write(event("ending", node, text=end["text"]))
            self.stop_nodes({n: {"state": e["state"], "cause": e["cause"]}
                             for n, e in ends.items()})
        if self.max_wall and time.time() - self.started > self.max_wall and \
                not self.ending.issuperset(self.view.nodes):
            self.write(event("policy", None, action="stop",
                             text="--max-wall %.0f s reached: stopping the run" % self.max_wall))
            self.stop_nodes({n: {"state": "stopped", "cause": {
                "message": "--max-wall %.0f s reached" % self.max_wall}}
                for n in self.view.nodes})
        if over is not None:
            self.over = over
            state, cause = over
            self.write(event("run_ended", None, state=state, cause=cause,
                             text="the run %s%s" % (state, ": %s: %s" % (
                                 cause.get("node"), cause.get("message"))
                                 if cause and cause.get("message") else "")))

    def run(self, sock):
        threading.Thread(target=self.serve, args=(sock,), daemon=True).start()
        self.write(event("judge", None, action="started", stall_after=self.view.stall_after,
                         on_hang=self.on_hang, on_nan=self.on_nan, max_wall=self.max_wall,
                         notify=bool(self.spec.get("notify")), rules=list(RULES),
                         cordon_within_s=self.view.cordon_within_s,
                         auto_cordon=self.surgeon.on,
                         text="the judge watches the run on this host (stall after %.0f s, "
                         "on hang: %s)" % (self.view.stall_after, self.on_hang)))
        ended_at, settled = None, False
        alone_since = time.monotonic()  # no node connected since (none yet, at the start)
        while not self.stop.is_set():
            self.tick()
            if self.over is not None:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at >= SETTLE:
                    settled = True
                    break
            with self.lock:
                alone = not self.lines
            if not alone:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since >= ALONE_END:
                # every supervisor gone without a last word (killed, hosts lost): nobody is
                # left to judge, and a judge must not outlive its run
                self.write(event("judge", None, action="ended",
                                 text="no node has been connected to the judge for %.0f s: it "
                                 "ends; a console judges what is left" % ALONE_END))
                break
            self.stop.wait(TICK)
        if self.over is None:  # stopped (SIGTERM): say how the run ended, if it has
            time.sleep(0.5)  # the nodes' last states, sent as their supervisors ended
            self.tick()
        self.surgeon.forget()
        self.notifier.drain()
        if settled:
            self.release_job()

    def release_job(self):
        """The run is over by itself: the Slurm job rankdeck submitted for it ends now, not at
        its time limit (``spec.release_job``: its id). Last: on a cgroup site the job's end
        ends this process too (docs/SLURM.md)."""
        job = self.spec.get("release_job")
        if not isinstance(job, str) or not job.isdigit():
            return
        state = self.over[0]
        self.write(event("policy", None, action="release", text=(
            "the run %s: Slurm job %s, which rankdeck submitted for it, ends now (%s)"
            % (state, job, "COMPLETED" if state == "succeeded" else "FAILED"))))
        why = release_job(job, state == "succeeded")
        if why:
            self.write(event("policy", None, action="release", text=(
                "Slurm job %s could not be ended (%s): it holds its nodes until its time "
                "limit or `rankdeck stop`" % (job, why))))


def main(run_root):
    """``python -m agent judge RUN_ROOT``: read the spec from stdin, listen, judge."""
    spec = json.loads(sys.stdin.buffer.read())
    jdir = judge_dir(run_root)
    os.makedirs(jdir, 0o700, exist_ok=True)
    from .store import listen_socket  # here: only the judge needs it
    sock = listen_socket(spec["addr"], int(spec.get("port") or 0))
    judge = Judge(spec, jdir)
    me = procs.stat(os.getpid())
    state = {"state": "running", "pid": os.getpid(), "starttime": me.starttime,
             "addr": spec["addr"], "port": sock.getsockname()[1], "started": judge.started}
    write_json_atomic(os.path.join(jdir, "state.json"), state)

    def stop(_signum, _frame):
        judge.stop.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        judge.run(sock)
    finally:
        sock.close()
        state.update(state="exited", ended=time.time())
        write_json_atomic(os.path.join(jdir, "state.json"), state)
    return 0
