"""Where a node's torchrun is in its life: rendezvous, workers running, restarting workers...

torchrun says so only in log records below its default level: the rendezvous handler
(torch/distributed/elastic/rendezvous/dynamic_rendezvous.py) logs joining at INFO and each
step of its state machine at DEBUG, the elastic agent (torch/distributed/elastic/agent/server/api.py) logs starting,
stopping and restarting its worker group at INFO. The bootstrap in agent/torchrun/log.py lets
the records whose message holds one of :data:`RECORDED` through to ``torchrun-ranks.log`` as
``<created> <message>`` (and nothing more reaches torchrun's console). :class:`PhaseTracker`
turns those lines into the node's phase, which the supervisor puts in ``state.json``::

    {"name": "rendezvous", "round": 3, "note": "waiting", "since": 1763750000.1}

Names: ``starting`` (torchrun launched, nothing said yet), ``rendezvous`` (joining or waiting
in round N: ``note`` is ``joining``, ``waiting`` (a participant), ``wait list`` (the round is
full, waits for the next) or ``complete``), ``assigning ranks`` (joined round N as node rank
``rank`` of ``world``; the nodes exchange their worker counts through the store, where a
peer that vanishes makes torchrun fail with DistStoreError ``role_info``), ``starting
workers``, ``workers running``, ``restarting workers`` (``note``: why), ``finished`` (its
workers are done; waits for the other nodes), ``stopping`` (a signal), ``closed`` (the
rendezvous was closed: no node can join again) and ``ended`` (torchrun exited; set by the
supervisor). The messages are torch 2.x's, unchanged since torch 1.9 for the agent's.

DeepSpeed's launcher has no rendezvous and no such records: its phase comes from its own
console lines (deepspeed/launcher/launch.py, :data:`DEEPSPEED_RULES`, fed by
:meth:`PhaseTracker.feed_console`): ``starting`` until it spawns a rank, then ``workers
running``, ``stopping`` once it kills its ranks (``note``: the exit code of the rank that
made it, or the signal it got) and ``ended`` as for torchrun.
"""

import re

# A record whose message holds one of these is written to the record file (the bootstrap).
RECORDED = (
    "Rendezvous complete for workers",
    "Rendezvous'ing worker group",
    "Starting worker group",
    "Stopping worker group",
    "will restart worker group",
    "worker group successfully finished",
    "Local worker group finished",
    "death signal",
    "attempts to join the next round",
    "added itself to the participants of round",
    "added itself to the wait list of round",
    "added itself to the redundancy list of round",
    "marked round",
    "has joined round",
    "Detected dead node",
    "marked the rendezvous",
    "has closed the rendezvous",
)

_LINE = re.compile(r"^(\d+(?:\.\d+)?) (.*)$")
_ROUND = re.compile(r"round (\d+)")
_JOINED = re.compile(r"has joined round (\d+) .* as rank (\d+) in a world of size (\d+)")
_RESTART = re.compile(r"Worker group (\w+)\. (\d+)/(\d+) attempts left")
_NEW_NODES = re.compile(r"Detected (\d+) new nodes")
_DEAD = re.compile(r"Detected dead node '([^']*)'")

# (words in the message, phase name, note); the first that matches wins
_RULES = (
    ("attempts to join the next round", "rendezvous", "joining"),
    ("Rendezvous'ing worker group", "rendezvous", "joining"),
    ("added itself to the participants of round", "rendezvous", "waiting"),
    ("added itself to the wait list of round", "rendezvous", "wait list"),
    ("added itself to the redundancy list of round", "rendezvous", "redundant"),
    ("as complete", "rendezvous", "complete"),
    ("Rendezvous complete for workers", "starting workers", None),
    ("Starting worker group", "workers running", None),
    ("Stopping worker group", "restarting workers", "stopping workers"),
    ("will restart worker group", "restarting workers", None),
    ("worker group successfully finished", "finished", None),
    ("Local worker group finished", "finished", None),
    ("death signal", "stopping", None),
    ("marked the rendezvous", "closed", None),
    ("has closed the rendezvous", "closed", None),
)


# DeepSpeed's launcher's console lines (deepspeed/launcher/launch.py, 0.19): (words, phase
# name, note); the first that matches wins. It kills every rank when one exits non-zero
# ("Killing subprocess", then "... exits with return code = N") or on SIGTERM/SIGINT.
DEEPSPEED_RULES = (
    ("spawned with command", "workers running", None),
    ("exits with return code", "stopping", "a rank exited with code {code}"),
    ("Killing subprocess", "stopping", None),
    ("Main process received", "stopping", "{signal}"),
)
_DS_CODE = re.compile(r"exits with return code = (-?\d+)")
_DS_SIGNAL = re.compile(r"received (SIG\w+)")


class PhaseTracker:
    """The phase of one torchrun, from its record lines fed in order (:meth:`feed`)."""

    def __init__(self, now=None):
        self.phase = {"name": "starting", "round": None, "note": None, "since": now}
        self.round = None  # the last round this torchrun took part in

    def reset(self, now):
        """A new torchrun of this node was launched."""
        self.__init__(now)

    def end(self, now, note=None):
        """torchrun exited: ``note`` says how (``exit 1``)."""
        self._set(now, "ended", note)

    def feed(self, line):
        """One line of the record file; True when the phase changed."""
        m = _LINE.match(line)
        if not m:
            return False  # a continuation line of the worker-group record
        when, message = float(m.group(1)), m.group(2)
        joined = _JOINED.search(message)
        if joined:
            self.round = int(joined.group(1))
            return self._set(when, "assigning ranks", None, rank=int(joined.group(2)),
                             world=int(joined.group(3)))
        dead = _DEAD.search(message)
        if dead:  # the phase stays; who was dropped is worth saying
            return self._set(when, self.phase["name"], "dropped dead node %s" % dead.group(1),
                             keep_since=True)
        for words, name, note in _RULES:
            if words in message:
                found = _ROUND.search(message)
                if found and name == "rendezvous":
                    self.round = int(found.group(1))
                if name == "restarting workers" and note is None:
                    note = _restart_reason(message)
                return self._set(when, name, note)
        return False

    def feed_console(self, line, now):
        """One line of DeepSpeed's launcher's console (:data:`DEEPSPEED_RULES`), read at
        ``now``; True when the phase changed. A kill's note stays through its later lines."""
        for words, name, note in DEEPSPEED_RULES:
            if words not in line:
                continue
            code, sig = _DS_CODE.search(line), _DS_SIGNAL.search(line)
            if note is not None:
                note = note.format(code=code.group(1) if code else "?",
                                   signal="received %s" % sig.group(1) if sig else "a signal")
            elif name == self.phase["name"]:
                return False  # one line per rank killed: the phase and its note stay
            return self._set(now, name, note)
        return False

    def _set(self, when, name, note, keep_since=False, **extra):
        phase = {"name": name, "round": self.round, "note": note, "since": when}
        phase.update(extra)
        if _without_since(phase) == _without_since(self.phase):
            return False  # the same phase said again (two lines for one step)
        if keep_since:
            phase["since"] = self.phase["since"]
        self.phase = phase
        return True


def _without_since(phase):
    return {k: v for k, v in phase.items() if k != "since"}


def _restart_reason(message):
    """Why torchrun restarts its workers, from its own words."""
    failed = _RESTART.search(message)
    if failed:
        return "worker group %s, %s/%s restarts left" % (failed.group(1).lower(),
                                                        failed.group(2), failed.group(3))
    new = _NEW_NODES.search(message)
    if new:
        return "%s new node(s) waiting to join" % new.group(1)
    return None
