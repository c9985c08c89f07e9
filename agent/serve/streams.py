"""What serve pushes to its console unasked: the journals it subscribed to, each node's state,
action log and consoles, and the host's telemetry (docs/PROTOCOL.md, "Pushed messages"). One
thread turns :meth:`Streams.stream_loop`; agent/serve/server.py answers the requests (``subscribe``
adds a :class:`Subscription` here) and owns the connection's writer, which every pushed
message goes through.

A subscription whose journal cannot be read (damaged bytes: agent/wire/protocol.py
``JournalCorrupt``) is read once more by a fresh reader, then ended with a ``stream_end``
message saying where and why; its state and the other subscriptions go on.

The stream loop sleeps until a subscribed node's folder changes (the supervisor appended to the
journal, or replaced state.json: agent/host/watch.py), a new subscription, or the next telemetry
sample; where inotify cannot be had it polls at agent/host/pace.py's rate.
"""

import os
import threading
import time

from ..host import actions
from ..node import folder as node
from ..wire import protocol
from ..host.gpu import GpuProbe
from ..host.stats import HostSampler
from ..host.journal import JournalReader, decode_meta
from ..host.pace import Pace
from ..host.watch import open_watch

STATE_POLL = 0.25
# bytes of a journal one turn sends at most: in ``jbytes`` (frames) what is ready goes as one
# message up to this (or one record longer than it), not one per 64 KiB read: each message
# costs the console a wake-up, a header to parse and a dispatch (docs/BENCHMARKS.md, "Ingest"). A console takes any jbytes message up to 16 MiB (agent_messages.MAX_FRAME),
# an older one too: nothing to negotiate.
TURN_BYTES = protocol.BATCH_BYTES * 4
IDLE = 1.0  # with a watch: the longest sleep of the stream loop (a dead supervisor is seen)


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
        self.state_seen = {}  # state.json as last read, and its stat (agent/node/folder.py)
        self.watched = False  # its folder's changes wake the stream loop


def wire(records):
    """Records ``(meta, data, end)`` as a message's ``recs``: ``[meta]`` or ``[meta, text]``."""
    out = []
    for meta, data, _end in records:
        if data:
            out.append([meta, protocol.bytes_to_text(data)])
        else:
            out.append([meta])
    return out


class Streams:
    """One connection's pushed messages: its subscriptions, read and sent by one thread."""

    def __init__(self, write, closed):
        self.write = write  # one message, encoded: serve's writer (one lock for every message)
        self.closed = closed  # set: the connection is gone (serve's event)
        self.subs = {}
        self.subs_lock = threading.Lock()
        self.gpu = GpuProbe()
        self.gpu_interval = 1.0
        self.host = HostSampler()  # sampled with the GPUs, sent in the same message
        self.host.prime()  # so the first message has rates already (agent/host/stats.py)
        self.wake = threading.Event()  # set: the stream loop turns now (a new subscription)
        self.watch = open_watch()  # None: the stream loop polls (agent/host/pace.py)
        self.state_due = False  # a turn skipped a state check (read it within STATE_POLL)
        self.behind = False  # the last pump left records unsent (its budget ran out)

    def send(self, msg):
        self.write(protocol.encode(msg))

    def add(self, sub):
        """Serve ``sub`` (in place of one of its id) from the next turn, which comes at once."""
        with self.subs_lock:
            old = self.subs.pop(sub.sub_id, None)
            if old:
                old.reader.close()
            self.subs[sub.sub_id] = sub
        self._watch(sub)
        self.turn_now()

    def remove(self, sub_id):
        with self.subs_lock:
            sub = self.subs.pop(sub_id, None)
        if sub:
            sub.reader.close()

    def turn_now(self):
        """The stream loop turns at once (a new subscription, the end)."""
        self.wake.set()
        if self.watch is not None:
            self.watch.wake()

    def _journal_line(self, sub_id, records):
        """The ``journal`` message of raw records (agent/host/journal.py ``split``)."""
        try:
            return protocol.journal_line(sub_id, records[-1][3], records)
        except ValueError:  # a meta not as the supervisor writes them: parsed, as before
            parsed = [(decode_meta(meta, start), data, end) for meta, data, start, end in records]
            return protocol.encode({"t": "journal", "sub": sub_id, "end": records[-1][3],
                                    "recs": wire(parsed)})

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
        page = actions.read_page(sub.ndir, sub.actions_from)
        # a console's first look: the log so far is history it does not show (console/model/
        # consoles.py), its last page will do; later pages sent one a turn would be events
        while not sub.actions_sent and not sub.actions_from and page["more"]:
            page = actions.read_page(sub.ndir, page["end"])
        entries, end = page["actions"], page["end"]
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
