"""One per SSH connection (or local pipe): speaks the protocol on stdin/stdout, dies with it.

`serve` holds nothing that matters: runs belong to their supervisors (started and signalled by
agent/node/ops.py, read by agent/node/folder.py). When stdin closes (the connection dropped, the
console quit) serve exits and the training carries on. This module dispatches requests
(``op_<name>``); what is new in subscribed journals is pushed by agent/serve/streams.py.
Requests are handled on threads so a slow one (a stop waiting out a grace period) never holds
up the log stream; every message goes through one writer lock.

A console says who it is in its first request (``hello``: docs/PROTOCOL.md); one that says
``watch`` makes its connection read-only for good: this serve then refuses every request not
in ``READ_ONLY_OPS`` (kind ``read-only``), whatever the client is. Each request that changes a
run (agent/host/actions.py ``CHANGES``), done or refused, is appended to the node's action log
by the writer the judge's link uses too; the node operations themselves are the ones the
judge's link runs (agent/node/door.py, one door for both). What that does and does not
promise: docs/SECURITY.md, "Read-only consoles".
"""

import fcntl
import os
import signal
import socket
import sys
import threading
import time

from ..host import actions
from ..surgery import expel
from ..slurm import host_step
from ..node import door, folder as node
from ..wire import protocol
from ..host.paths import host_path, host_python
from ..host.journal import read_back
from .preflight import Listener, host_facts
from ..wire.protocol import RequestError
from .streams import Streams, Subscription, wire
from ..store.tcpstore import fresh_store, running_store, start_store, stop_store, wait_ready
from ..wire.version import agent_version

OPS_LOG = "RANKDECK_SERVE_OPS"  # a file each request's op is appended to: tests prove with it
# which requests consoles made (tests/spine/test_judge_consoles.py); unset, nothing is written
PIPE_BYTES = 1 << 20  # serve's output pipe, where the system lets it be this wide
F_SETPIPE_SZ = 1031  # Linux's fcntl, named in Python's fcntl from 3.10 on (a host may run 3.8)
# what a read-only connection may ask: requests that read. Any other (a new op too) is refused.
# `stacks` and `why` are answered without signalling the ranks (agent/torchrun/stacks.py), and
# so is `judge` `why`: the judge asks every node for a report without signals.
READ_ONLY_OPS = frozenset(("ping", "hello", "subscribe", "unsubscribe", "state", "runs",
                           "scrollback", "stacks", "why", "judge", "actions", "record",
                           "hosts", "goodput"))
READ_ONLY_ASKS = ("why", "ping")  # of the judge (op_judge): not node surgery
ROLES = ("drive", "watch")


class Server:
    def __init__(self, out=None):
        self.out = out or sys.stdout.buffer
        self.lock = threading.Lock()
        self.closed = threading.Event()
        # what is pushed unasked: journals, states, telemetry (agent/serve/streams.py)
        self.streams = Streams(self.write, self.closed)
        self.listeners = {}
        self._syncs = None  # --sync transfers of this connection (agent/sync/place.py), once used
        self.syncs_lock = threading.Lock()  # the first --sync request makes _syncs
        self.console = {}  # who the console said it is (op_hello)
        self.read_only = False  # set by a `watch` hello, never cleared
        self.joined = {}  # node folder -> this connection's file among its consoles
        self.refusals = actions.Refusals()  # its refused requests, as the action log has them

    # -- output ----------------------------------------------------------------------------
    def send(self, msg):
        self.write(protocol.encode(msg))

    def write(self, data):
        """One message, encoded (a line)."""
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
        op = op if isinstance(op, str) else repr(op)  # a crafted one: a name still
        fn = getattr(self, "op_" + op, None)
        if os.environ.get(OPS_LOG):
            log_op(os.environ[OPS_LOG], op)
        args = msg.get("args") or {}
        started = time.time()
        if self.read_only_refuses(op, args):  # first: an op unknown here too
            reply = {"ok": False, "kind": "read-only", "error": "this console attached "
                     "read-only (rankdeck watch / attach --read-only): %s is refused; attach "
                     "without --read-only to change the run" % str(op)[:64]}
        elif fn is None:
            reply = {"ok": False, "kind": "usage",
                     "error": "unknown request %r (agent %s)" % (op, agent_version())}
        elif self.read_only:  # run folders only, and no interpreter of its choosing
            reply = self.answer(lambda got: fn(node.read_only_args(got)), args)
        else:
            reply = self.answer(fn, args)
        if op in actions.CHANGES:  # before the answer: a console that has it finds the line
            self.log_action(op, args, started, reply)
        reply.update(t="res", id=req_id)
        self.send(reply)

    def read_only_refuses(self, op, args):
        """Whether this connection is read-only and ``op`` could change a run."""
        if not self.read_only:
            return False
        if op == "judge":
            return not isinstance(args, dict) or args.get("ask") not in READ_ONLY_ASKS
        return op not in READ_ONLY_OPS

    answer = staticmethod(door.answer)  # the answer to one request, without its id

    def log_action(self, op, args, started, reply):
        """The request in the node's action log, through the writer the judge's link uses
        too (agent/node/door.py ``log_action``)."""
        door.log_action(op, args, self.console, started, reply, self.read_only, self.refusals)

    def op_hello(self, args):
        """The console says who it is (``who``: user@laptop, ``console``: its id), its
        ``role`` (``drive``, or ``watch``: this connection is read-only from now on) and
        whether it ``attach``-es (is listed among the node's consoles when it subscribes)."""
        role = args.get("role", "drive")
        if role not in ROLES:
            raise RequestError("role is drive or watch, not %r" % (role,), "usage")
        if self.read_only and role != "watch":
            raise RequestError("this connection is read-only and stays so; a new connection "
                               "is needed to drive the run", "read-only")
        self.read_only = role == "watch"
        self.console = {"who": actions.short(args.get("who") or "?"),
                        "console": actions.short(args.get("console") or ""),
                        "role": role, "since": time.time(), "attach": bool(args.get("attach"))}
        return {"login": actions.login(), "role": role}

    def op_actions(self, args):
        """A page of the node's action log from ``offset``: ``{"actions", "end", "start",
        "more"}`` (agent/host/actions.py ``read_page``)."""
        return actions.read_page(node.node_dir(args), int(args.get("offset", 0)))

    def op_ping(self, args):
        return {"time": time.time()}

    def op_preflight(self, args):
        return host_facts(args)

    def op_netcheck(self, args):
        """``check --deep``'s network probe on this host (agent/serve/netprobe.py), waited
        for: its figures, or ``{"error"}``."""
        from . import netprobe  # as for sync: not needed to start
        return netprobe.run_probe(args)

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
        root = host_path(args["run_root"])
        try:
            if args.get("fresh"):  # a static world's restart: a new store, a new port
                return dict(fresh_store(root, args["addr"], host_python(args.get("python"))),
                            fresh=True)
            return start_store(root, args["addr"], host_python(args.get("python")),
                               int(args.get("port", 0)), early=bool(args.get("early")))
        except RuntimeError as exc:
            raise RequestError(str(exc), "store")

    def op_store_wait(self, args):
        """The store an ``early`` store_start began, once it serves (agent/store/tcpstore.py)."""
        wait = args.get("wait", 120)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 < wait <= 600:
            raise RequestError("wait must be a number of seconds in (0, 600]", "usage")
        try:
            return wait_ready(host_path(args["run_root"]), float(wait))
        except RuntimeError as exc:
            raise RequestError(str(exc), "store")

    def op_store_stop(self, args):
        return stop_store(host_path(args["run_root"]))

    def op_expel(self, args):
        """A node's torchrun, confirmed dead by its fence, taken out of the run's rendezvous
        by the store process on this host (agent/surgery/expel.py); ``{"expelled", "why"}``."""
        root = host_path(args["run_root"])
        try:
            req = expel.checked(args.get("member"))
        except ValueError as exc:
            raise RequestError(str(exc), "usage")
        if not running_store(root):
            return {"expelled": False, "why": "no store of the run runs on this host"}
        wait = min(float(args.get("wait", 5)), 30.0)
        return expel.answer(root, expel.ask(root, req), wait)

    # -- the run's judge (agent/judge/judge.py) ---------------------------------------------------
    def op_judge_start(self, args):
        from ..judge import control as judge_control  # as for sync: not needed to start
        try:
            return judge_control.start_judge(host_path(args["run_root"]), args["spec"])
        except RuntimeError as exc:
            raise RequestError(str(exc), "judge")

    def op_judge_stop(self, args):
        from ..judge import control as judge_control
        return judge_control.stop_judge(host_path(args["run_root"]))

    def op_judge(self, args):
        """A console's question to the run's judge: ``why`` (a fresh verdict), ``ping``, or
        ``cordon`` (node surgery, ``args``: out, in, who, action, text)."""
        from ..judge import control as judge_control
        if args.get("ask") not in ("why", "ping", "cordon"):
            raise RequestError("the judge answers why, ping and cordon, not %r"
                               % args.get("ask"), "usage")
        asked = args.get("args")
        if self.read_only and args["ask"] == "why":  # the judge asks every node: no signals
            asked = {"signals": False}
        try:
            return judge_control.ask_judge(host_path(args["run_root"]), args["ask"],
                                           float(args.get("timeout", 60)), asked)
        except RuntimeError as exc:
            raise RequestError(str(exc), "no-judge")

    def op_goodput(self, args):
        """The run's goodput as its judge on this host last wrote it (agent/judge/goodput.py):
        ``{"report", "written", "now"}``, ``report`` None when there is none."""
        from ..judge import control as judge_control
        from ..judge import goodput as judge_goodput
        return judge_goodput.read_report(judge_control.judge_dir(host_path(args["run_root"])))

    # -- code to the hosts (agent/sync/place.py) --------------------------------------------------
    def _sync(self, op, args):
        from ..sync import place as sync  # here, not at the top: every connection starts serve (launch time)
        with self.syncs_lock:
            if self._syncs is None:
                self._syncs = sync.Transfers()
        try:
            return sync.request(self._syncs, op, args)
        except sync.SyncError as exc:
            raise RequestError(str(exc), exc.kind)

    def op_sync_check(self, args):
        return self._sync("sync_check", args)

    def op_sync_plan(self, args):
        return self._sync("sync_plan", args)

    def op_sync_put(self, args):
        return self._sync("sync_put", args)

    def op_sync_commit(self, args):
        return self._sync("sync_commit", args)

    def op_sync_abort(self, args):
        return self._sync("sync_abort", args)

    # -- the node's run: the one door the judge's link goes through too (agent/node/door.py) --
    def op_start(self, args):
        return door.OPS["start"](args)

    def op_stop(self, args):
        return door.OPS["stop"](args)

    def op_restart(self, args):
        return door.OPS["restart"](args)

    def op_fence(self, args):
        return door.OPS["fence"](args)

    def op_unfence(self, args):
        return door.OPS["unfence"](args)

    def op_drop_workers(self, args):
        return door.OPS["drop_workers"](args)

    def op_host_up(self, args):
        """Whether this Slurm job's rankdeck-host step answers on this node (the console
        starts it on a proctrack/cgroup site: agent/slurm/host_step.py)."""
        return {"up": host_step.up()}

    def op_standby(self, args):
        return door.OPS["standby"](args)

    def op_state(self, args):
        return node.state_of(args)

    def op_runs(self, args):
        return node.runs(args)

    def op_record(self, args):
        return node.record_of(args)

    # -- the host itself: `rankdeck hosts` (agent/serve/hosts.py) ------------------------------
    def op_hosts(self, args):
        """Load, GPU memory and who holds it, strays, the host's record of runs and incidents."""
        from . import hosts  # as for sync: not needed to start
        return hosts.report(args)

    def op_kill_strays(self, args):
        """The login user's strays named by pid and start time, stopped and checked gone."""
        from . import hosts
        return hosts.kill_strays(args)

    # -- journals (pushed by agent/serve/streams.py) ----------------------------------------
    def op_subscribe(self, args):
        ndir = node.node_dir(args)
        sub_id = args.get("sub") or args["node"]
        sub = Subscription(sub_id, ndir, int(args.get("offset", 0)),
                           int(args.get("quiet_until", 0)), int(args.get("actions_from", 0)),
                           args.get("frames") is True)
        if (self.console.get("attach") and args["node"] != "judge" and ndir not in self.joined
                and os.path.isdir(ndir)):
            self.joined[ndir] = actions.join(ndir, {k: v for k, v in self.console.items()
                                                    if k != "attach"})
        self.streams.add(sub)
        return {"sub": sub_id, "offset": sub.reader.offset}

    def op_unsubscribe(self, args):
        self.streams.remove(args.get("sub") or args["node"])
        return {}

    def op_scrollback(self, args):
        """Log data older than a console keeps: the newest records of some files before an offset."""
        path = os.path.join(node.node_dir(args), "journal")
        want = min(int(args.get("bytes", 256 * 1024)), protocol.BATCH_BYTES * 8)
        records, start = read_back(path, int(args["before"]), args["files"], want,
                                   int(args.get("since", 0)))
        return {"recs": wire(records), "start": start}

    def op_stacks(self, args):
        from ..torchrun.stacks import dump_stacks  # as for sync: not needed to start
        return dump_stacks(node.node_dir(args), self.no_signals(args))

    def op_why(self, args):
        from ..torchrun import fr_dump  # as for sync: not needed to start
        return fr_dump.node_report(node.node_dir(args), self.no_signals(args))

    def no_signals(self, args):
        """A read-only connection's request sends no signal to the ranks, whatever it asks."""
        return dict(args, signals=False) if self.read_only else args

    # -- the connection ----------------------------------------------------------------------
    def serve_forever(self, inp=None):
        inp = inp or sys.stdin.buffer
        self.send(protocol.hello(agent_version(), socket.gethostname(),
                                 "%d.%d.%d" % sys.version_info[:3], os.getpid()))
        threading.Thread(target=self.streams.stream_loop, daemon=True).start()
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
        self.streams.turn_now()
        for path in self.joined.values():
            actions.leave(path)
        self.refusals.tell(self.console)


def widen_pipe(fd, size=PIPE_BYTES):
    """Let the pipe ``fd`` (serve's output) hold ``size`` bytes, where the system allows it
    (Linux's ``F_SETPIPE_SZ``; up to /proc/sys/fs/pipe-max-size, 1 MiB by default, for a user
    under their pipe quota); anything else keeps the pipe as it is: a socket, another system,
    a limit. A 64 KiB pipe took a turn's ``jbytes`` message of ~200 KB in three writes and the
    console woke for each (docs/BENCHMARKS.md, "Ingest"); the kernel holds at
    most ``size`` bytes, and a full pipe still holds serve back."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", F_SETPIPE_SZ), size)
    except (OSError, ValueError):
        pass


def log_op(path, op):
    """Append ``<pid> <op>`` to ``path`` (OPS_LOG); a line each, whole (O_APPEND)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, ("%d %s\n" % (os.getpid(), str(op)[:64].replace("\n", " "))).encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def main():
    # A dropped SSH connection must end serve quietly, and must not signal the runs.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    node.keep_files_private()
    widen_pipe(sys.stdout.fileno())
    server = Server()
    server.serve_forever()
    return 0
