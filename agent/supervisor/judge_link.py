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
``restart`` and ``stop`` signal the supervisor itself (SIGUSR1, SIGTERM after writing how the
node ends), exactly as a console's request through ``serve`` does, and are kept in the node's
action log as the judge's (``who`` ``judge``), as serve keeps a console's.

Standard library only; Python >= 3.9.
"""

import os
import signal
import threading
import time

from ..host import actions
from ..surgery import expel
from ..wire import judge as judge_wire
from ..host.journal import JournalReader
from ..node.fence import drop_workers, fenced_end, mark_fenced
from ..node.ops import STOP_END, restart
from ..host.runfiles import read_json, write_json_atomic

FORWARD = ("file", "metric", "event", "sample")  # steps, ranks, events; samples: stragglers
POLL = 0.5
DRAIN_READS = 256  # reads of the journal (of a MiB each) one turn makes at most
BACKOFF = (1.0, 2.0, 5.0)
RESTART_WAIT = 180.0
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
        try:
            while True:
                msg = line.read()
                if msg is None:
                    return
                if msg.get("t") == "req":
                    threading.Thread(target=self._answer, args=(line, msg), daemon=True).start()
        except judge_wire.WireError:
            return

    def _answer(self, line, msg):
        op, req_id = msg.get("op"), msg.get("id")
        try:
            if op == "why":  # signals False: a watcher's verdict, none to the ranks
                args = msg.get("args") if isinstance(msg.get("args"), dict) else {}
                data = self.why(signals=args.get("signals") is not False)
            elif op == "restart":
                master_port = (msg.get("args") or {}).get("master_port")
                data = self._logged("restart", lambda: self._restart(master_port))
            elif op == "stop":
                end = (msg.get("args") or {}).get("end")
                detail = "the run is over: %s" % end.get("state") if isinstance(end, dict) \
                    else None
                data = self._logged("stop", lambda: self._stop(end), detail)
            elif op == "fence":
                args = msg.get("args") or {}
                data = self._logged("fence", lambda: self._fence(args),
                                    str(args.get("why") or "")[:200] or None)
            elif op == "drop_workers":  # the judge cordons a hung node: ours wait for it
                data = self._logged("drop_workers", lambda: drop_workers({
                    "run_root": os.path.dirname(self.node_dir.rstrip(os.sep)),
                    "node": os.path.basename(self.node_dir.rstrip(os.sep))}))
            else:
                raise ValueError("unknown request %r" % (op,))
            line.send({"t": "res", "id": req_id, "ok": True, "data": data})
        except judge_wire.WireError:
            return
        except Exception as exc:  # an answer, never a dead link
            try:
                line.send({"t": "res", "id": req_id, "ok": False, "error": str(exc)[:300]})
            except judge_wire.WireError:
                return

    def _logged(self, op, do, detail=None):
        """``do()``, kept in the node's action log as the judge's with its outcome (a stop is
        logged before its SIGTERM, a fence too: the supervisor may be gone before a later write)."""
        started = time.time()
        node = os.path.basename(self.node_dir.rstrip(os.sep))

        def log(result):
            actions.record(self.node_dir, actions.entry(actions.CHANGES[op], node, JUDGE,
                                                        started, result, detail))
        if op in ("stop", "fence"):
            log("ok")
            return do()
        try:
            data = do()
        except Exception as exc:
            log("error: %s" % exc)
            raise
        log("ok")
        return data

    def _restart(self, master_port=None):
        """Restart the node (``master_port``: on that port, a static world's restart) through
        the node operation serve's ``restart`` runs (agent/node/ops.py), one door for both: it
        answers once the new torchrun started and the old one is gone, with ``member``, the old
        torchrun in the c10d rendezvous (agent/surgery/expel.py: the judge has it taken out).
        The link's own copy waited only for ``running`` and answered with no member while the
        old torchrun was still exiting, so the judge's restart skipped the expel."""
        node_dir = self.node_dir.rstrip(os.sep)
        return restart({"run_root": os.path.dirname(node_dir), "node": os.path.basename(node_dir),
                        "master_port": master_port, "timeout": RESTART_WAIT})

    def _fence(self, args):
        """The judge's cordon (--auto-cordon): fenced first, as `fence` from a console does
        (agent/node/fence.py), then stopped; the stop's kill report (``left``: what survived it)
        reaches the judge in the node's last state. ``member``: its torchrun in the c10d
        rendezvous, read before the stop (agent/surgery/expel.py), or None."""
        why = str(args.get("why") or "cordoned by the judge")
        mark_fenced(self.node_dir, {"who": str(args.get("who") or "the judge")[:200],
                                    "why": why[:300]})
        st = read_json(os.path.join(self.node_dir, "state.json")) or {}
        member = expel.member(st.get("torchrun_pid"))
        return dict(self._stop(fenced_end(why, args.get("grace"), 500)), member=member)

    def _stop(self, end):
        if isinstance(end, dict):
            write_json_atomic(os.path.join(self.node_dir, STOP_END), end)
        os.kill(os.getpid(), signal.SIGTERM)
        return {}
