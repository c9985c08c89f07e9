"""One per SSH connection (or local pipe): speaks the protocol on stdin/stdout, dies with it.

`serve` holds nothing that matters: runs belong to their supervisors. When stdin closes (the
connection dropped, the console quit) serve exits and the training carries on. Requests are
handled on threads so a slow one (a stop waiting out a grace period) never holds up the log
stream; every pushed message goes through one writer lock.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from . import procs, protocol
from .gpu import GpuProbe
from .journal import JournalReader, read_back
from .store import start_store, stop_store
from .supervisor import log_tail, read_json
from .version import HERE, agent_version

AGENT_PARENT = os.path.dirname(HERE)
POLL = 0.02
STATE_POLL = 0.25


class RequestError(Exception):
    """A request that cannot be done; ``kind`` tells the console what sort of failure."""

    def __init__(self, message, kind="error"):
        super().__init__(message)
        self.kind = kind


def node_dir(args):
    return os.path.join(os.path.expanduser(args["run_root"]), args["node"])


def supervisor_alive(state):
    return bool(state) and procs.alive(state.get("pid", -1), state.get("starttime"))


def node_state(ndir):
    """state.json plus whether its supervisor still lives (``alive``)."""
    state = read_json(os.path.join(ndir, "state.json"))
    if state is None:
        return None
    state["alive"] = supervisor_alive(state)
    if not state["alive"] and state.get("state") in ("starting", "running", "restarting",
                                                       "stopping"):
        # The supervisor died without recording an end (SIGKILL, host reboot).
        state["state"] = "lost"
    return state


class Subscription(object):
    def __init__(self, sub_id, ndir, offset, quiet_until=0):
        self.sub_id = sub_id
        self.quiet_until = quiet_until  # data records starting before this are not sent
        self.ndir = ndir
        self.reader = JournalReader(os.path.join(ndir, "journal"), offset)
        self.last_state = None
        self.last_state_check = 0.0


class Server(object):
    def __init__(self, out=None):
        self.out = out or sys.stdout.buffer
        self.lock = threading.Lock()
        self.subs = {}
        self.subs_lock = threading.Lock()
        self.gpu = GpuProbe()
        self.gpu_interval = 1.0
        self.closed = threading.Event()
        self.listeners = {}

    # -- output ----------------------------------------------------------------------------
    def send(self, msg):
        data = protocol.encode(msg)
        with self.lock:
            try:
                self.out.write(data)
                self.out.flush()
            except (BrokenPipeError, OSError):
                self.closed.set()

    # -- requests --------------------------------------------------------------------------
    def handle(self, msg):
        if msg.get("t") != "req":
            return
        req_id = msg.get("id")
        op = msg.get("op")
        fn = getattr(self, "op_" + str(op), None)
        if fn is None:
            self.send({"t": "res", "id": req_id, "ok": False, "kind": "usage",
                       "error": "unknown request %r (agent %s)" % (op, agent_version())})
            return
        try:
            data = fn(msg.get("args") or {})
        except RequestError as exc:
            self.send({"t": "res", "id": req_id, "ok": False, "kind": exc.kind,
                       "error": str(exc)})
        except Exception as exc:  # report, never die: other runs' streams go on
            self.send({"t": "res", "id": req_id, "ok": False, "kind": "error",
                       "error": "%s: %s" % (type(exc).__name__, exc)})
        else:
            self.send({"t": "res", "id": req_id, "ok": True, "data": data})

    def op_ping(self, args):
        return {"time": time.time()}

    def op_facts(self, args):
        from .preflight import host_facts

        return host_facts(args)

    def op_preflight(self, args):
        from .preflight import host_facts

        return host_facts(args)

    def op_probe_tcp(self, args):
        """Can this host open a TCP connection to ``addr:port``? (rendezvous reachability)"""
        start = time.monotonic()
        try:
            with socket.create_connection((args["addr"], int(args["port"])),
                                          timeout=float(args.get("timeout", 3))):
                pass
        except OSError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, "ms": round((time.monotonic() - start) * 1000, 1)}

    def op_listen(self, args):
        """A throwaway TCP listener so other nodes can prove they reach this one."""
        from .preflight import Listener

        try:
            lis = Listener(args["addr"], int(args.get("port", 0)))
        except OSError as exc:
            raise RequestError("cannot listen on %s: %s" % (args["addr"], exc), "listen")
        self.listeners[lis.port] = lis
        return {"port": lis.port}

    def op_unlisten(self, args):
        lis = self.listeners.pop(int(args["port"]), None)
        if lis:
            lis.close()
        return {}

    def op_store_start(self, args):
        root = os.path.expanduser(args["run_root"])
        try:
            return start_store(root, args["addr"], args.get("python"), int(args.get("port", 0)))
        except RuntimeError as exc:
            raise RequestError(str(exc), "store")

    def op_store_stop(self, args):
        return stop_store(os.path.expanduser(args["run_root"]))

    def op_start(self, args):
        ndir = node_dir(args)
        state = node_state(ndir)
        if state and state["alive"]:
            raise RequestError("node %s of run %s is already running (supervisor pid %s)"
                               % (args["node"], state.get("run_id"), state.get("pid")),
                               "conflict")
        return self._spawn_supervisor(ndir, args["spec"])

    def _spawn_supervisor(self, ndir, spec):
        os.makedirs(os.path.join(ndir, "torchrun"), exist_ok=True)
        spec = dict(spec)
        spec.setdefault("log_dir", os.path.join(ndir, "torchrun"))
        env = dict(os.environ)
        env["PYTHONPATH"] = AGENT_PARENT + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        before = read_json(os.path.join(ndir, "state.json"), {}) or {}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "supervisor", ndir],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env, cwd=ndir,
        )
        # The spec (with secrets) goes through the pipe: never a file, never a command line.
        proc.stdin.write(protocol.encode(spec))
        proc.stdin.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = node_state(ndir)
            if state and state.get("pid") == proc.pid and state.get("launches", 0) > before.get(
                    "launches", 0):
                threading.Thread(target=proc.wait, daemon=True).start()  # reap if it ends
                return state
            if proc.poll() is not None:
                raise RequestError("supervisor exited with code %s: %s" % (
                    proc.returncode, log_tail(os.path.join(ndir, "supervisor.log"))), "agent")
            time.sleep(0.02)
        raise RequestError("supervisor did not report within 30 s; see %s/supervisor.log"
                           % ndir, "timeout")

    def _signal_and_wait(self, ndir, sig, done, timeout):
        state = node_state(ndir)
        if not state:
            raise RequestError("no such run or node here: %s" % ndir, "missing")
        if not state["alive"]:
            return state
        os.kill(state["pid"], sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = node_state(ndir)
            if now and done(state, now):
                return now
            time.sleep(0.05)
        raise RequestError("node did not finish within %d s; state %s"
                           % (timeout, (node_state(ndir) or {}).get("state")), "timeout")

    def op_stop(self, args):
        ndir = node_dir(args)
        timeout = float(args.get("timeout", 90))
        state = self._signal_and_wait(ndir, signal.SIGTERM, lambda old, new: not new["alive"],
                                      timeout)
        # Belt and braces: anything still marked as this run's (the supervisor may have been
        # SIGKILLed earlier) is killed here, and what is left is reported.
        marker = "%s/%s" % (state.get("run_id"), state.get("node"))
        report = procs.kill_run(None, marker, grace=2.0)
        state["left"] = procs.run_pids(None, marker)
        state["sweep"] = report
        return state

    def op_restart(self, args):
        ndir = node_dir(args)
        state = node_state(ndir)
        if state and state["alive"]:
            return self._signal_and_wait(
                ndir, signal.SIGUSR1,
                lambda old, new: new.get("launches", 0) > old.get("launches", 0)
                or not new["alive"], float(args.get("timeout", 90)))
        if not args.get("spec"):
            raise RequestError("node %s is not running here; restart needs the run spec"
                               % args["node"], "missing")
        marker = "%s/%s" % (args["spec"]["run_id"], args["node"])
        procs.kill_run(None, marker, grace=2.0)
        return self._spawn_supervisor(ndir, dict(args["spec"], restarted=True))

    def op_state(self, args):
        ndir = node_dir(args)
        state = node_state(ndir) or {"state": "missing"}
        try:
            state["journal_size"] = os.path.getsize(os.path.join(ndir, "journal"))
        except OSError:
            state["journal_size"] = 0
        return state

    def op_runs(self, args):
        root = os.path.expanduser(args["runs_dir"])
        out = []
        try:
            names = sorted(os.listdir(root))
        except OSError:
            return {"runs": []}
        for run_id in names:
            nodes = {}
            for node in sorted(os.listdir(os.path.join(root, run_id))):
                st = node_state(os.path.join(root, run_id, node))
                if st:
                    nodes[node] = st.get("state")
            out.append({"run_id": run_id, "nodes": nodes})
        return {"runs": out}

    def op_subscribe(self, args):
        ndir = node_dir(args)
        sub_id = args.get("sub") or args["node"]
        sub = Subscription(sub_id, ndir, int(args.get("offset", 0)),
                           int(args.get("quiet_until", 0)))
        with self.subs_lock:
            old = self.subs.pop(sub_id, None)
            if old:
                old.reader.close()
            self.subs[sub_id] = sub
        return {"sub": sub_id, "offset": sub.reader.offset}

    def op_unsubscribe(self, args):
        with self.subs_lock:
            sub = self.subs.pop(args.get("sub") or args["node"], None)
        if sub:
            sub.reader.close()
        return {}

    def op_scrollback(self, args):
        """Log data older than a console keeps: the newest records of some files before an offset."""
        path = os.path.join(node_dir(args), "journal")
        want = min(int(args.get("bytes", 256 * 1024)), protocol.BATCH_BYTES * 8)
        records, start = read_back(path, int(args["before"]), args["files"], want,
                                   int(args.get("since", 0)))
        return {"recs": self._wire(records), "start": start}

    def op_stacks(self, args):
        from .stacks import dump_stacks

        return dump_stacks(node_dir(args), args)

    # -- pushed streams --------------------------------------------------------------------
    @staticmethod
    def _wire(records):
        out = []
        for meta, data, _end in records:
            if data:
                out.append([meta, protocol.bytes_to_text(data)])
            else:
                out.append([meta])
        return out

    def pump(self):
        """Send what is new in subscribed journals and states; True if anything was sent."""
        with self.subs_lock:
            subs = list(self.subs.values())
        sent = False
        now = time.monotonic()
        for sub in subs:
            # state.json is read BEFORE the journal is drained and sent only once it is: the
            # records written before that state (a node's last lines, its "ended") go first.
            check = now - sub.last_state_check >= STATE_POLL
            state = node_state(sub.ndir) if check else None
            drained = False
            budget = protocol.BATCH_BYTES * 4
            while budget > 0:
                records = sub.reader.read(protocol.BATCH_BYTES)
                if not records:
                    drained = True
                    break
                budget -= sum(len(d) for _m, d, _e in records) + 64 * len(records)
                if sub.quiet_until and records[0][0]["j"] < sub.quiet_until:
                    # a console resuming its output or wanting recent lines only: state
                    # records yes, lines of records that start before quiet_until no
                    records = [r for r in records if r[0]["j"] >= sub.quiet_until or
                               r[0].get("k") != "data"]
                    if not records:
                        continue
                self.send({"t": "journal", "sub": sub.sub_id, "end": records[-1][2],
                           "recs": self._wire(records)})
                sent = True
            if check and drained:
                sub.last_state_check = now
                if state != sub.last_state:
                    sub.last_state = state
                    self.send({"t": "state", "sub": sub.sub_id, "state": state})
                    sent = True
        return sent

    def stream_loop(self):
        last_gpu = 0.0
        while not self.closed.is_set():
            sent = self.pump()
            now = time.monotonic()
            if self.gpu_interval and now - last_gpu >= self.gpu_interval:
                last_gpu = now
                self.send({"t": "gpu", "snap": self.gpu.snapshot()})
            if not sent:
                self.closed.wait(POLL)

    def serve_forever(self, inp=None):
        inp = inp or sys.stdin.buffer
        self.send(protocol.hello(agent_version(), socket.gethostname(),
                                 "%d.%d.%d" % sys.version_info[:3], os.getpid()))
        threading.Thread(target=self.stream_loop, daemon=True).start()
        for line in iter(inp.readline, b""):
            if not line.strip():
                continue
            try:
                msg = protocol.decode(line)
            except protocol.ProtocolError as exc:
                self.send({"t": "error", "error": str(exc)})
                continue
            threading.Thread(target=self.handle, args=(msg,), daemon=True).start()
        self.closed.set()


def main():
    # A dropped SSH connection must end serve quietly, and must not signal the runs.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    server = Server()
    server.serve_forever()
    return 0
