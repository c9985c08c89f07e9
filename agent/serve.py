"""One per SSH connection (or local pipe): speaks the protocol on stdin/stdout, dies with it.

`serve` holds nothing that matters: runs belong to their supervisors (started and signalled by
agent/node_ops.py, read by agent/node.py). When stdin closes (the connection dropped, the
console quit) serve exits and the training carries on. This module dispatches requests (``op_<name>``) and pushes
what is new in subscribed journals. Requests are handled on threads so a slow one (a stop
waiting out a grace period) never holds up the log stream; every pushed message goes through
one writer lock.

A console says who it is in its first request (``hello``: docs/PROTOCOL.md); one that says
``watch`` makes its connection read-only for good: this serve then refuses every request not
in ``READ_ONLY_OPS`` (kind ``read-only``), whatever the client is. Each request that changes a
run (agent/actions.py ``CHANGES``), done or refused, is appended to the node's action log.
What that does and does not promise: docs/SECURITY.md, "Read-only consoles".

A subscription whose journal cannot be read (damaged bytes: agent/protocol.py
``JournalCorrupt``) is read once more by a fresh reader, then ended with a ``stream_end``
message saying where and why; its state and the other subscriptions go on
(docs/PROTOCOL.md, "Pushed messages").

The stream loop sleeps until a subscribed node's folder changes (the supervisor appended to the
journal, or replaced state.json: agent/watch.py), a new subscription, or the next telemetry
sample; where inotify cannot be had it polls at agent/pace.py's rate.

Over 450 lines: one op_<name> per request of docs/PROTOCOL.md, each a line or two that hands
the work to its module; the table of requests reads best whole.
"""

import fcntl
import os
import signal
import socket
import sys
import threading
import time

from . import actions, expel, host_step, node, node_fence, node_ops, protocol
from .gpu import GpuProbe
from .hoststats import HostSampler
from .hostpaths import host_path, host_python
from .journal import JournalReader, decode_meta, read_back
from .pace import Pace
from .preflight import Listener, host_facts
from .protocol import RequestError
from .store import fresh_store, running_store, start_store, stop_store
from .version import agent_version
from .watch import open_watch

STATE_POLL = 0.25
OPS_LOG = "RANKDECK_SERVE_OPS"  # a file each request's op is appended to: tests prove with it
# which requests consoles made (tests/spine/test_judge_consoles.py); unset, nothing is written
# bytes of a journal one turn sends at most: in ``jbytes`` (frames) what is ready goes as one
# message up to this (or one record longer than it), not one per 64 KiB read: each message
# costs the console a wake-up, a header to parse and a dispatch (docs/BENCHMARKS.md, "Ingest,
# eighth part"). A console takes any jbytes message up to 16 MiB (agent_messages.MAX_FRAME),
# an older one too: nothing to negotiate.
TURN_BYTES = protocol.BATCH_BYTES * 4
PIPE_BYTES = 1 << 20  # serve's output pipe, where the system lets it be this wide
F_SETPIPE_SZ = 1031  # Linux's fcntl, named in Python's fcntl from 3.10 on (a host may run 3.8)
IDLE = 1.0  # with a watch: the longest sleep of the stream loop (a dead supervisor is seen)
# what a read-only connection may ask: requests that read. Any other (a new op too) is refused.
# `stacks` and `why` are answered without signalling the ranks (agent/stacks.py).
READ_ONLY_OPS = frozenset(("ping", "hello", "subscribe", "unsubscribe", "state", "runs",
                           "scrollback", "stacks", "why", "judge", "actions", "record"))
READ_ONLY_ASKS = ("why", "ping")  # of the judge (op_judge): not node surgery
ROLES = ("drive", "watch")


class Subscription:
    """One console's reading position in one node's journal."""

    def __init__(self, sub_id, ndir, offset, quiet_until=0, actions_from=0, frames=False):
        self.sub_id = sub_id
        self.frames = frames  # records sent as the journal holds them (``jbytes``)
        self.actions_from = actions_from  # the node's action log, read up to here
        self.actions_sent = False  # the first `actions` message goes even when empty
        self.consoles = None  # the attached consoles last sent
        self.quiet_until = quiet_until  # data records starting before this are not sent
        self.ndir = ndir
        self.reader = JournalReader(os.path.join(ndir, "journal"), offset)
        self.sent_to = offset  # the journal's records before this were sent (or skipped)
        self.retried_at = None  # where a fresh reader was tried after a failed read
        self.ended = None  # why its journal can no longer be read (stream_end was sent)
        self.last_state = None
        self.last_state_check = float("-inf")  # never (monotonic starts at boot)
        self.state_seen = {}  # state.json as last read, and its stat (agent/node.py)
        self.watched = False  # its folder's changes wake the stream loop


class Server:
    def __init__(self, out=None):
        self.out = out or sys.stdout.buffer
        self.lock = threading.Lock()
        self.subs = {}
        self.subs_lock = threading.Lock()
        self.gpu = GpuProbe()
        self.gpu_interval = 1.0
        self.host = HostSampler()  # sampled with the GPUs, sent in the same message
        self.host.prime()  # so the first message has rates already (agent/hoststats.py)
        self.closed = threading.Event()
        self.wake = threading.Event()  # set: the stream loop turns now (a new subscription)
        self.watch = open_watch()  # None: the stream loop polls (agent/pace.py)
        self.state_due = False  # a turn skipped a state check (read it within STATE_POLL)
        self.behind = False  # the last pump left records unsent (its budget ran out)
        self.listeners = {}
        self._syncs = None  # --sync transfers of this connection (agent/sync.py), once used
        self.console = {}  # who the console said it is (op_hello)
        self.read_only = False  # set by a `watch` hello, never cleared
        self.joined = {}  # node folder -> this connection's file among its consoles

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

    @staticmethod
    def answer(fn, args):
        """The answer to one request, without its id."""
        try:
            data = fn(args)
        except RequestError as exc:
            return {"ok": False, "kind": exc.kind, "error": str(exc)}
        except Exception as exc:  # report, never die: other runs' streams go on
            return {"ok": False, "kind": "error", "error": "%s: %s" % (type(exc).__name__, exc)}
        return {"ok": True, "data": data}

    def log_action(self, op, args, started, reply):
        """The request in the node's action log (agent/actions.py); one without a run folder
        named (a sync before any run) is not logged."""
        if not isinstance(args, dict) or not args.get("run_root") or not args.get("node"):
            return
        result = "ok" if reply["ok"] else "%s: %s" % (reply.get("kind"), reply.get("error"))
        data = reply.get("data")
        if isinstance(data, dict) and data.get("expelled") is False:  # asked, not done
            result = "not done: %s" % data.get("why")
        end = args.get("end")
        detail = args.get("detail") or (
            "the run is over: %s" % end.get("state") if isinstance(end, dict) else None)
        try:
            ndir = node.node_dir(args)
        except (TypeError, ValueError, RequestError):
            return
        # a sync comes before the run: it makes the node's folder; the others need one
        if op == "sync_commit" or os.path.isdir(ndir):
            actions.record(ndir, actions.entry(actions.CHANGES[op], args["node"], self.console,
                                               started, result, detail))

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
        """The node's action log from byte ``offset``: ``{"actions": [...], "end": N}``."""
        entries, end = actions.read(node.node_dir(args), int(args.get("offset", 0)))
        return {"actions": entries, "end": end}

    def op_ping(self, args):
        return {"time": time.time()}

    def op_preflight(self, args):
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
                               int(args.get("port", 0)))
        except RuntimeError as exc:
            raise RequestError(str(exc), "store")

    def op_store_stop(self, args):
        return stop_store(host_path(args["run_root"]))

    def op_expel(self, args):
        """A node's torchrun, confirmed dead by its fence, taken out of the run's rendezvous
        by the store process on this host (agent/expel.py); ``{"expelled", "why"}``."""
        root = host_path(args["run_root"])
        try:
            req = expel.checked(args.get("member"))
        except ValueError as exc:
            raise RequestError(str(exc), "usage")
        if not running_store(root):
            return {"expelled": False, "why": "no store of the run runs on this host"}
        wait = min(float(args.get("wait", 5)), 30.0)
        return expel.answer(root, expel.ask(root, req), wait)

    # -- the run's judge (agent/judge.py) ---------------------------------------------------
    def op_judge_start(self, args):
        from . import judge_control  # as for sync: not needed to start
        try:
            return judge_control.start_judge(host_path(args["run_root"]), args["spec"])
        except RuntimeError as exc:
            raise RequestError(str(exc), "judge")

    def op_judge_stop(self, args):
        from . import judge_control
        return judge_control.stop_judge(host_path(args["run_root"]))

    def op_judge(self, args):
        """A console's question to the run's judge: ``why`` (a fresh verdict), ``ping``, or
        ``cordon`` (node surgery, ``args``: out, in, who, action, text)."""
        from . import judge_control
        if args.get("ask") not in ("why", "ping", "cordon"):
            raise RequestError("the judge answers why, ping and cordon, not %r"
                               % args.get("ask"), "usage")
        try:
            return judge_control.ask_judge(host_path(args["run_root"]), args["ask"],
                                           float(args.get("timeout", 60)), args.get("args"))
        except RuntimeError as exc:
            raise RequestError(str(exc), "no-judge")

    # -- code to the hosts (agent/sync.py) --------------------------------------------------
    def _sync(self, op, args):
        from . import sync  # here, not at the top: every connection starts serve (launch time)
        with self.subs_lock:
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

    # -- the node's run (agent/node.py, node_ops.py, node_fence.py) -------------------------
    def op_start(self, args):
        return node_ops.start(args)

    def op_stop(self, args):
        return node_ops.stop(args)

    def op_restart(self, args):
        return node_ops.restart(args)

    def op_fence(self, args):
        return node_fence.fence(args, node_ops.stop)

    def op_unfence(self, args):
        return node_fence.unfence(args)

    def op_drop_workers(self, args):
        return node_fence.drop_workers(args)

    def op_host_up(self, args):
        """Whether this Slurm job's rankdeck-host step answers on this node (the console
        starts it on a proctrack/cgroup site: agent/host_step.py)."""
        return {"up": host_step.up()}

    def op_standby(self, args):
        return node_fence.standby(args)

    def op_state(self, args):
        return node.state_of(args)

    def op_runs(self, args):
        return node.runs(args)

    def op_record(self, args):
        return node.record_of(args)

    # -- journals --------------------------------------------------------------------------
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
        with self.subs_lock:
            old = self.subs.pop(sub_id, None)
            if old:
                old.reader.close()
            self.subs[sub_id] = sub
        self._watch(sub)
        self.turn_now()
        return {"sub": sub_id, "offset": sub.reader.offset}

    def turn_now(self):
        """The stream loop turns at once (a new subscription, the end)."""
        self.wake.set()
        if self.watch is not None:
            self.watch.wake()

    def op_unsubscribe(self, args):
        with self.subs_lock:
            sub = self.subs.pop(args.get("sub") or args["node"], None)
        if sub:
            sub.reader.close()
        return {}

    def op_scrollback(self, args):
        """Log data older than a console keeps: the newest records of some files before an offset."""
        path = os.path.join(node.node_dir(args), "journal")
        want = min(int(args.get("bytes", 256 * 1024)), protocol.BATCH_BYTES * 8)
        records, start = read_back(path, int(args["before"]), args["files"], want,
                                   int(args.get("since", 0)))
        return {"recs": self._wire(records), "start": start}

    def op_stacks(self, args):
        from .stacks import dump_stacks  # as for sync: not needed to start
        return dump_stacks(node.node_dir(args), self.no_signals(args))

    def op_why(self, args):
        from . import fr_dump  # as for sync: not needed to start
        return fr_dump.node_report(node.node_dir(args), self.no_signals(args))

    def no_signals(self, args):
        """A read-only connection's request sends no signal to the ranks, whatever it asks."""
        return dict(args, signals=False) if self.read_only else args

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

    def _journal_line(self, sub_id, records):
        """The ``journal`` message of raw records (agent/journal.py ``split``)."""
        try:
            return protocol.journal_line(sub_id, records[-1][3], records)
        except ValueError:  # a meta not as the supervisor writes them: parsed, as before
            parsed = [(decode_meta(meta, start), data, end) for meta, data, start, end in records]
            return protocol.encode({"t": "journal", "sub": sub_id, "end": records[-1][3],
                                    "recs": self._wire(parsed)})

    def subscriptions(self):
        """The subscriptions now (a copy: requests add and drop them on other threads)."""
        with self.subs_lock:
            return list(self.subs.values())

    def pump(self, subs):
        """Send what is new in the journals and states of ``subs``; the journal bytes sent
        (a state message counts as one). ``behind``: a journal was not read to its end. A
        subscription whose turn fails is ended (``stream_end``); the others go on."""
        sent = 0
        now = time.monotonic()
        self.behind = False
        for sub in subs:
            try:
                sent += self.pump_one(sub, now)
            except Exception as exc:  # a bug or a file of its own: that stream alone ends
                self.end_stream(sub, "agent error: %s: %s" % (type(exc).__name__, exc))
                self.drop(sub)
        return sent

    def pump_one(self, sub, now):
        """One subscription's turn: its journal's new records, then its state, action log and
        consoles once the journal is drained; what was sent, as :meth:`pump` counts it."""
        # state.json is read BEFORE the journal is drained and sent only once it is: the
        # records written before that state (a node's last lines, its "ended") go first.
        check = now - sub.last_state_check >= STATE_POLL
        self.state_due = self.state_due or not check
        state = node.node_state(sub.ndir, sub.state_seen) if check else None
        sent, drained = 0, True
        if sub.ended is None:
            try:
                sent, drained = self.send_journal(sub)
            except (ValueError, OSError) as exc:  # JournalCorrupt, a meta that is no JSON
                drained = self.journal_failed(sub, exc)
        self.behind = self.behind or not drained
        if check and drained:
            sub.last_state_check = now
            if state != sub.last_state:
                sub.last_state = state
                self.send({"t": "state", "sub": sub.sub_id, "state": state})
                sent += 1
            sent += self.send_operators(sub)
        return sent

    def send_journal(self, sub):
        """``(bytes sent, drained)``: a turn's budget of ``sub``'s new journal records sent,
        and whether its journal was read to its end."""
        sent = 0
        budget = TURN_BYTES
        while budget > 0:
            if sub.frames and sub.reader.offset >= sub.quiet_until:
                start, data = sub.reader.read_bytes(budget)  # what is ready: one message
                if not data:
                    return sent, True
                self.write(protocol.journal_bytes(sub.sub_id, start, data))
                sub.sent_to = start + len(data)
                budget -= len(data)
                sent += len(data)
                continue
            records = sub.reader.read(protocol.BATCH_BYTES, raw=True)
            if not records:
                return sent, True
            nbytes = sum(len(d) for _m, d, _s, _e in records) + 64 * len(records)
            budget -= nbytes
            if sub.quiet_until and records[0][2] < sub.quiet_until:
                # a console resuming its output or wanting recent lines only: state
                # records yes, lines of records that start before quiet_until no
                records = [r for r in records if r[2] >= sub.quiet_until or
                           decode_meta(r[0], r[2]).get("k") != "data"]
                if not records:
                    sub.sent_to = sub.reader.offset
                    continue
            self.write(self._journal_line(sub.sub_id, records))
            sub.sent_to = sub.reader.offset
            sent += nbytes
        return sent, False

    def journal_failed(self, sub, exc):
        """``sub``'s journal could not be read on from ``sent_to``: read once more by a fresh
        reader from there (a reader's own state: the stream goes on; whether drained), then
        ended with a ``stream_end`` message saying why (True: its state goes on)."""
        if sub.retried_at != sub.sent_to:
            sub.retried_at = sub.sent_to
            sub.reader.close()
            sub.reader = JournalReader(sub.reader.path, sub.sent_to)
            return False
        self.end_stream(sub, str(exc))
        return True

    def end_stream(self, sub, why):
        """Tell the console that ``sub``'s journal stream has ended, where and why, once."""
        if sub.ended is not None:
            return
        sub.ended = why[:300]
        sub.reader.close()
        self.send({"t": "stream_end", "sub": sub.sub_id, "offset": sub.sent_to,
                   "why": sub.ended})

    def drop(self, sub):
        """``sub`` is no longer served (its turn failed outside its journal)."""
        with self.subs_lock:
            if self.subs.get(sub.sub_id) is sub:
                del self.subs[sub.sub_id]

    def send_operators(self, sub):
        """New lines of the node's action log and the consoles attached, when they changed
        (``actions`` and ``consoles`` messages); how many messages were sent."""
        if os.path.basename(sub.ndir) == "judge":  # the judge's folder: neither
            return 0
        sent = 0
        entries, end = actions.read(sub.ndir, sub.actions_from)
        if end != sub.actions_from or not sub.actions_sent:
            sub.actions_from, sub.actions_sent = end, True
            self.send({"t": "actions", "sub": sub.sub_id, "recs": entries, "end": end})
            sent += 1
        consoles = actions.attached(sub.ndir)
        if consoles != sub.consoles:
            sub.consoles = consoles
            self.send({"t": "consoles", "sub": sub.sub_id, "consoles": consoles})
            sent += 1
        return sent

    def send_telemetry(self, subs):
        """The ``gpu`` message: a GPU snapshot and a host sample, measuring the disk of the
        first subscription's run folder (in its workdir); that folder. The first message
        waits out the primed window (hoststats.FIRST_WINDOW_S at most, once a connection: a
        sleep, not a poll) so that it has rates."""
        self.closed.wait(self.host.settle_s())
        folder = subs[0].ndir if subs else None
        self.send({"t": "gpu", "snap": self.gpu.snapshot(), "host": self.host.sample(folder)})
        return folder

    def stream_loop(self):
        """Push what is new to the console until the connection closes. A turn that fails
        (a bug: a subscription's own failure ends that one alone, :meth:`pump`) ends every
        subscription with its reason, and the loop goes on: nothing ends unsaid (the
        thread's stderr reaches no one)."""
        while not self.closed.is_set():
            try:
                self._stream_turns()
            except Exception as exc:
                for sub in self.subscriptions():
                    self.end_stream(sub, "agent error: %s: %s" % (type(exc).__name__, exc))
                    self.drop(sub)
                self.wake.wait(IDLE)
                self.wake.clear()

    def _stream_turns(self):
        last_gpu = float("-inf")
        measured = None  # the run folder whose disk the last host sample measured
        pace = Pace()
        while not self.closed.is_set():
            subs = self.subscriptions()
            folder = subs[0].ndir if subs else None
            # A new subscription's journal and state go after a sample of its disk: a console
            # that prints once caught up (a new shell's status) has every figure then.
            if self.gpu_interval and (time.monotonic() - last_gpu >= self.gpu_interval or
                                      folder not in (None, measured)):
                measured = self.send_telemetry(subs)
                last_gpu = time.monotonic()
            sent = self.pump(subs)
            wait = pace.after(sent)
            if self.behind:  # a journal had more than a turn's budget: go on at once
                continue
            if self.watch is not None and self._all_watched():
                # the supervisor batches its appends already: a change is read at once
                idle = IDLE
                if self.gpu_interval:
                    idle = min(idle, last_gpu + self.gpu_interval - time.monotonic())
                if self.state_due:
                    idle = min(idle, STATE_POLL)
                self.state_due = False
                self.watch.wait(idle)
                self.watch.drain()
            else:
                self.wake.wait(wait)
                self.wake.clear()

    def _watch(self, sub):
        """Have the node's folder wake the stream loop; False while it cannot (no such folder
        yet, or the user's inotify limit: that subscription is polled)."""
        if not sub.watched and self.watch is not None:
            try:
                self.watch.add(sub.ndir)
                sub.watched = True
            except OSError:
                pass
        return sub.watched

    def _all_watched(self):
        return all([self._watch(sub) for sub in self.subscriptions()])

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
        self.turn_now()
        for path in self.joined.values():
            actions.leave(path)


def widen_pipe(fd, size=PIPE_BYTES):
    """Let the pipe ``fd`` (serve's output) hold ``size`` bytes, where the system allows it
    (Linux's ``F_SETPIPE_SZ``; up to /proc/sys/fs/pipe-max-size, 1 MiB by default, for a user
    under their pipe quota); anything else keeps the pipe as it is: a socket, another system,
    a limit. A 64 KiB pipe took a turn's ``jbytes`` message of ~200 KB in three writes and the
    console woke for each (docs/BENCHMARKS.md, "Ingest, eighth part"); the kernel holds at
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
