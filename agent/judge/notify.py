"""Notifications for a run nobody watches: ``--notify CMD`` run by the judge on its host.

For each event of a kind the user picked (``--notify-on``, default every kind), the command
runs through ``/bin/sh -c`` with the event as one JSON object on its stdin (secrets masked),
in the run folder, with a time limit. A command that fails, hangs or cannot start is reported
as a ``notify_failed`` event (its exit code, or "timed out"), never a crash, and the run goes
on. Commands run one at a time, in the order of the events (a queue and one thread).

Kinds: ``stall`` (once per stall, at its first stalled rank), ``verdict``, ``failed``,
``succeeded``, ``stopped``, ``restarted`` (by the judge's policy), ``diverged``, ``cordon``
(a node proposed for cordon), ``loop`` (a restart loop, or ranks that resumed from different
steps: agent/judge/loops.py).
docs/JUDGE.md has a webhook example.

Standard library only; Python >= 3.9.
"""

import json
import os
import queue
import signal
import subprocess
import threading

from ..rules.notify import ASKED, KINDS, kind_of

TIMEOUT_S = 30.0
QUEUE_MAX = 256


def _kill_group(proc):
    """End the command and whatever it started (its own session: ``sh -c 'sleep 30'``'s
    sleep holds the pipes open after the shell is gone)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.communicate()


class Notifier:
    """``command``: the shell command or None (nothing is run); ``kinds``: the kinds to
    send (None: all); ``masker``: agent/rules/mask.py Masker; ``report(event)``: journals an event."""

    def __init__(self, command, kinds, masker, report):
        self.command = command
        self.kinds = set(kinds or KINDS)
        self.masker = masker
        self.report = report
        self.queue = queue.Queue(QUEUE_MAX)
        self.in_stall = False
        self.thread = None
        self.sent = 0

    def consider(self, rec):
        """Queue ``rec`` if its kind is wanted (a stall once, until the run steps again)."""
        what = rec.get("what")
        if what == "stepping":
            self.in_stall = False
        kind = kind_of(rec)
        if kind == "verdict" and rec.get("reason") == ASKED:
            return  # a console asked: its user is watching
        if kind == "stall":
            if self.in_stall:
                return
            self.in_stall = True
        if not self.command or kind is None or kind not in self.kinds:
            return
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()
        try:
            self.queue.put_nowait(dict(rec, kind=kind))
        except queue.Full:
            pass  # a command slower than the events: the newest are dropped, not the run

    def _run(self):
        while True:
            rec = self.queue.get()
            if rec is None:
                return
            self._send(rec)

    def _send(self, rec):
        body = self.masker.mask_text(json.dumps(rec, sort_keys=True, default=str)) + "\n"
        what = "--notify for %s" % rec["kind"]
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", self.command], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            return self._failed("%s could not start: %s" % (what, exc))
        try:
            _out, err = proc.communicate(body.encode("utf-8", "replace"), timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return self._failed("%s timed out after %.0f s and was killed" % (what, TIMEOUT_S))
        except OSError as exc:  # the command closed its stdin early
            _kill_group(proc)
            return self._failed("%s failed: %s" % (what, exc))
        if proc.returncode != 0:
            tail = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return self._failed("%s exited with code %s%s" % (
                what, proc.returncode, ": %s" % tail[0][:200] if tail[0] else ""))
        self.sent += 1

    def _failed(self, text):
        self.report({"k": "event", "what": "notify_failed", "node": None,
                     "text": self.masker.mask_text(text)})

    def drain(self, timeout=TIMEOUT_S + 5):
        """Let the queued commands run (the judge is about to end)."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join(timeout)
