"""A supervisor's line to the run's judge (agent/judge/judge.py): what the node's journal says goes
to the judge; what the judge asks of the node (its ranks' stacks and flight-recorder tails, a
restart, a stop, a fence) is done here.

A thread of the supervisor. It follows the node's own journal from where it stood when the
supervisor started and forwards the metas of ``file``, ``metric`` and ``event`` records (never
log data: the judge needs steps, not lines) and the node's state.json when it changes. After
a (re)connection it first says which rank each of the node's files belongs to, so a judge that
started again knows the node's ranks. A judge that cannot be reached is tried again every few
seconds; the node's run never waits for it.

Requests are answered on the link's own threads: ``why`` runs agent/torchrun/fr_dump.py's node report
(masked with the run's secrets before it leaves the host; with ``args.signals`` false, a
read-only watcher's verdict, the ranks get no signal: py-spy alone takes their stacks);
``restart``, ``stop``, ``fence`` and ``drop_workers`` go through the door a console's request
through ``serve`` goes through (agent/node/door.py: the same operation, the same action-log
writer), as the judge's (``who`` ``judge``); ``log_expel`` keeps the judge's expel of this
node's old torchrun in the node's action log.

Standard library only; Python >= 3.9.
"""

import os
import signal
import threading
import time

from ..node import door
from ..wire import judge as judge_wire
from ..host.journal import JournalReader
from ..host.runfiles import read_json
from . import resume_hint

# steps, ranks, events; samples: stragglers; telemetry (every 10 s) and ckpt_done: the
# judge's --prometheus GPU and checkpoint figures (agent/judge/figures.py), its view reads neither;
# resumed: where each rank resumed from after a restart (agent/judge/loops.py); ckpt (the
# trainer's checkpoint lines): the judge's goodput, its checkpoint saves (agent/judge/goodput.py)
FORWARD = ("file", "metric", "event", "sample", "telemetry", "ckpt_done", "resumed", "ckpt")
POLL = 0.5
DRAIN_READS = 256  # reads of the journal (of a MiB each) one turn makes at most
BACKOFF = (1.0, 2.0, 5.0)
RESTART_WAIT = 180.0
MAX_ASKS = 8  # the judge's requests answered at once (a thread each); more are refused
NODE_OPS = ("restart", "stop", "fence", "drop_workers")  # the judge's, through agent/node/door.py
JUDGE = {"who": "judge", "console": "judge"}  # who the action log names for the judge's asks


class JudgeLink:
    """``spec_judge``: the spec's ``judge`` ({"addr", "port", "token"?}); ``node_dir`` the
    node's folder; ``files()`` -> {fid: rank} of the node's files so far; ``why(signals=)``
    -> the node report (masked; ``signals`` False: its ranks get no signal for their stacks);
    ``log(text)`` the supervisor's log."""

    def __init__(self, spec_judge, node, node_dir, files, why, log):
        self.addr = spec_judge.get("addr")
        self.port = spec_judge.get("port")
        run_root = os.path.dirname(node_dir)
        self.token = spec_judge.get("token") or judge_wire.read_token(run_root)
        if spec_judge.get("token"):
            judge_wire.keep_token(run_root, spec_judge["token"])
        self.node = node
        self.node_dir = node_dir
        self.files = files
        self.why = why
        self.log = log
        journal = os.path.join(node_dir, "journal")
        self.reader = JournalReader(journal, os.path.getsize(journal)
                                    if os.path.exists(journal) else 0)
        self.state_mtime = None
        self.line = None
        self.closed = threading.Event()
        self.lock = threading.Lock()  # one sender of records at a time (the thread, close())

    def start(self):
        if not (self.addr and self.port and self.token):
            self.log("no judge for this run (an older console, or its host has none)")
            return
        threading.Thread(target=self._run, name="judge-link", daemon=True).start()

    def close(self):
        """The node's run ended: what the journal and state.json say last goes to the judge
        now (the forwarding thread dies with the process), then the link closes."""
        line = self.line
        if line is not None:
            with self.lock:
                try:
                    self._send_records(line)
                    self._send_state(line)
                except judge_wire.WireError:
                    pass
        self.closed.set()
        if line is not None:
            line.close()

    # -- the connection --------------------------------------------------------------------
    def _run(self):
        tries = 0
        while not self.closed.is_set():
            try:
                self.line = judge_wire.connect_peer(self.addr, int(self.port), self.token,
                                                    self.node)
            except (OSError, judge_wire.WireError) as exc:
                if tries == 0:
                    self.log("judge at %s:%s not reached: %s" % (self.addr, self.port, exc))
                self.closed.wait(BACKOFF[min(tries, len(BACKOFF) - 1)])
                tries += 1
                continue
            tries = 0
            self.log("connected to the judge at %s:%s" % (self.addr, self.port))
            reader = threading.Thread(target=self._requests, args=(self.line,), daemon=True)
            reader.start()
            try:
                self._forward(self.line, reader)
            except judge_wire.WireError as exc:
                self.log("judge link lost: %s" % exc)
            self.line.close()

    def _forward(self, line, reader):
        files = [{"k": "file", "f": fid, "rank": rank} for fid, rank in sorted(self.files().items())
                 if rank is not None]
        if files:
            line.send({"t": "recs", "recs": files})
        self.state_mtime = None
        while not self.closed.is_set() and reader.is_alive():
            with self.lock:
                self._send_state(line)
                self._send_records(line)
            self.closed.wait(POLL)

    def _send_records(self, line):
        """What the journal gained since the last turn, to its end (a MiB of it a message):
        one read a turn kept up with 2 MiB a second of log data at most, and a node that
        wrote more fed the judge steps ever older."""
        for _ in range(DRAIN_READS):
            offset = self.reader.offset
            recs = self.reader.read_metas(FORWARD)
            if recs:
                line.send({"t": "recs", "recs": recs})
            if self.reader.offset == offset:  # its end, or a record still being written
                return

    def _send_state(self, line):
        path = os.path.join(self.node_dir, "state.json")
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        if mtime != self.state_mtime:
            self.state_mtime = mtime
            state = read_json(path)
            if isinstance(state, dict):
                # sent: this host's clock now, so the judge can move the phase's `since` into
                # its own clock (agent/rules/judge_view.py: hosts' clocks differ)
                kill = state.get("kill") if isinstance(state.get("kill"), dict) else {}
                line.send({"t": "state", "state": dict({k: state.get(k) for k in (
                    "state", "phase", "cause", "exit_code", "launches", "restarts")},
                    sent=time.time(), left=kill.get("left") or [], gpu=kill.get("gpu"))})

    # -- what the judge asks ---------------------------------------------------------------
    def _requests(self, line):
        """The judge's requests, each answered on a thread of its own, :data:`MAX_ASKS` at once.
        Only a judge that proved the token gets here, and every message it sends checks (its
        MAC, agent/wire/judge.py): a bad one ends the line, and this loop."""
        asks = threading.BoundedSemaphore(MAX_ASKS)
        try:
            while True:
                msg = line.read()
                if msg is None:
                    return
                if msg.get("t") != "req":
                    continue
                if not asks.acquire(blocking=False):
                    line.send({"t": "res", "id": msg.get("id"), "ok": False,
                               "error": "busy: %d requests already in hand" % MAX_ASKS})
                    continue
                try:
                    threading.Thread(target=self._answer_one, args=(line, msg, asks),
                                     daemon=True).start()
                except RuntimeError as exc:  # no thread to be had
                    asks.release()
                    line.send({"t": "res", "id": msg.get("id"), "ok": False,
                               "error": str(exc)})
        except judge_wire.WireError as exc:
            self.log("judge link: %s" % exc)
            line.close()

    def _answer_one(self, line, msg, asks):
        try:
            self._answer(line, msg)
        finally:
            asks.release()

    def _answer(self, line, msg):
        op, req_id = msg.get("op"), msg.get("id")
        args = msg.get("args") if isinstance(msg.get("args"), dict) else {}
        if op in NODE_OPS:  # the node operations serve runs (agent/node/door.py)
            return self._node_op(line, op, req_id, args)
        if op == "log_expel":
            return self._log_expel(line, req_id, args)
        try:
            if op == "why":  # signals False: a watcher's verdict, none to the ranks
                data = self.why(signals=args.get("signals") is not False)
            else:
                raise ValueError("unknown request %r" % (op,))
            line.send({"t": "res", "id": req_id, "ok": True, "data": data})
        except judge_wire.WireError:
            return
        except Exception as exc:  # an answer, never a dead link
            self._send_error(line, req_id, str(exc))

    def _node_op(self, line, op, req_id, args):
        """The judge's ``op`` done through the door serve's requests go through
        (agent/node/door.py): the same operation, kept in the node's action log by the same
        writer, as the judge's (``who`` ``judge``). A stop or a fence of this very node is
        answered, and logged, before this process sends itself SIGTERM: it cannot wait for its
        own end (its last state says what the stop left)."""
        started = time.time()
        node_args = self._node_args(op, args)
        if op == "restart" and "resume_before" in args:  # --on-loop rollback (resume_hint.py)
            try:
                resume_hint.leave(self.node_dir, args["resume_before"])
            except ValueError as exc:
                try:
                    return self._send_error(line, req_id, str(exc))
                except judge_wire.WireError:
                    return
        inside = op in ("stop", "fence")
        reply = door.answer(lambda a: door.OPS[op](a, inside) if inside else door.OPS[op](a),
                            node_args)
        door.log_action(op, node_args, JUDGE, started, reply)
        data = reply.get("data")
        if reply["ok"] and op == "fence":  # what the judge reads of it (agent/judge/cordon.py)
            data = {"member": data.get("member"), "fenced": True}
        elif reply["ok"] and op == "stop":
            data = {}
        try:
            if reply["ok"]:
                line.send({"t": "res", "id": req_id, "ok": True, "data": data})
            else:
                self._send_error(line, req_id, reply.get("error") or "")
        except judge_wire.WireError:
            pass  # the judge went: the stop it asked for happens all the same
        finally:
            if reply["ok"] and inside:
                os.kill(os.getpid(), signal.SIGTERM)

    def _node_args(self, op, args):
        """The judge's request ``args`` as serve's request for ``op`` has them."""
        node_dir = self.node_dir.rstrip(os.sep)
        out = {"run_root": os.path.dirname(node_dir), "node": os.path.basename(node_dir)}
        if op == "restart":  # ``master_port``: a static world's restart on that port
            out.update(master_port=args.get("master_port"), timeout=RESTART_WAIT)
            if isinstance(args.get("named"), str):  # the verdict named it (the host's record)
                out["named"] = args["named"][:300]
        elif op == "stop":
            out["end"] = args.get("end") if isinstance(args.get("end"), dict) else None
        elif op == "fence":  # the judge's cordon (--auto-cordon): fenced, then stopped
            out.update(fence={"who": str(args.get("who") or "the judge")[:200],
                              "why": str(args.get("why") or "cordoned by the judge")[:300]},
                       grace=args.get("grace"))
        return out

    def _log_expel(self, line, req_id, args):
        """The judge had the store beside it take this node's old torchrun out of the
        rendezvous (after its restart: agent/judge/policy.py): kept in this node's action log,
        the node it was done for (the judge's host may run no node of the run). ``expelled``,
        ``why``: the store's answer; ``pid``: the old torchrun's."""
        pid = args.get("pid") if isinstance(args.get("pid"), int) else "?"
        node_args = dict(self._node_args("expel", args), detail=(
            "the judge had the store on its host take this node's old torchrun, pid %s, out "
            "of the rendezvous after its restart" % pid))
        started = args.get("at") if isinstance(args.get("at"), (int, float)) else time.time()
        door.log_action("expel", node_args, JUDGE, started, {"ok": True, "data": {
            "expelled": args.get("expelled") is True,
            "why": str(args.get("why") or "no reason given")[:200]}})
        try:
            line.send({"t": "res", "id": req_id, "ok": True, "data": {}})
        except judge_wire.WireError:
            pass

    @staticmethod
    def _send_error(line, req_id, error):
        try:
            line.send({"t": "res", "id": req_id, "ok": False, "error": str(error)[:300]})
        except judge_wire.WireError:
            pass
