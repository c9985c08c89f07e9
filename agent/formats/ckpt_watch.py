"""The checkpoints of a run on disk: when a save is complete, and when the trainer deleted one.

The supervisor hands every ``ckpt`` record it journals to :meth:`CheckpointWatch.add` and
journals what :meth:`CheckpointWatch.poll` returns:

- ``ckpt_done`` once per save: complete (every file it should have is there, none cut short,
  nothing grew between two looks ``settle`` seconds apart; agent/formats/ckpt_files.py), with its size
  and how long it took; or not complete, with what is missing, when the run ended first or a
  newer save completed while this one had stopped changing;
- ``ckpt_gone`` per announced path that existed and exists no longer: trainers that keep only
  their newest checkpoints (Hugging Face ``save_total_limit``, the reference trainer's
  ``--keep-ckpts``, Lightning's ``save_top_k``) delete older ones without a line saying so.
  A path is reported gone only after it was once seen on disk: Hugging Face prints "Saving
  model checkpoint to X" before it writes X;
- ``ckpt`` for a new entry of the ``--checkpoint-dir`` folder (``watch: true``), for trainers
  that print nothing when they save. Entries there before the run started are not announced.

Relative paths are the worker's, read against torchrun's working directory. Standard library
only; runs on Python >= 3.8.
"""

import collections
import os
import time

from .ckpt_files import look
from .plain import step_from_path

CHECK_EVERY = 5.0  # seconds between two looks for deleted checkpoints
SETTLE = 1.0  # seconds between two looks at a save being written (and at --checkpoint-dir)
WATCHED = 256  # newest announced paths looked at; older ones are left alone
_NOT_A_SAVE = (".", "tmp-")  # name starts: hidden or temporary files, a save in the making


class _Save:
    __slots__ = ("rec", "seen", "start", "snap", "done")

    def __init__(self, rec, seen):
        self.rec = rec
        self.seen = seen
        self.start = rec.get("ts") or time.time()  # announced (or first seen in the folder)
        self.snap = None  # the previous look
        self.done = False


class CheckpointWatch:
    def __init__(self, cwd, every=CHECK_EVERY, watched=WATCHED, watch_dir=None, settle=SETTLE):
        self.cwd = cwd
        self.every = every
        self.watched = watched
        self.settle = settle
        self.watch_dir = self._full(watch_dir) if watch_dir else None
        self._known_in_dir = None  # names in watch_dir already seen (None: not listed yet)
        self._paths = collections.OrderedDict()  # absolute path -> _Save
        self._expected = ()  # names the last complete folder checkpoint had
        self._next = 0.0
        self._next_settle = 0.0
        self.complete_at = 0.0  # when the newest save found complete was announced

    def _full(self, path):
        return os.path.join(self.cwd, os.path.expanduser(path))

    def add(self, rec):
        """A ``ckpt`` record the supervisor journaled (``path`` as the worker printed it)."""
        path = rec.get("path")
        if not path:
            return
        full = self._full(path)
        self._paths.pop(full, None)
        self._paths[full] = _Save(rec, os.path.lexists(full))
        while len(self._paths) > self.watched:
            self._paths.popitem(last=False)

    def poll(self, final=False):
        """Everything to journal now: new saves in ``--checkpoint-dir``, saves found complete
        (or, ``final``, not), deleted ones. Looks at most every ``settle`` seconds."""
        now = time.monotonic()
        out = []
        if final or now >= self._next_settle:
            self._next_settle = now + self.settle
            out.extend(self._found_in_dir())
            out.extend(self._finished(final))
        return out + self.gone(force=final)

    def gone(self, force=False):
        """``ckpt_gone`` records (``f``, ``step``, ``path``, ``ts``) for announced paths that
        disappeared; looks at most every ``every`` seconds unless ``force``."""
        now = time.monotonic()
        if not self._paths or (not force and now < self._next):
            return []
        self._next = now + self.every
        out = []
        for full, save in list(self._paths.items()):
            if os.path.lexists(full):
                save.seen = True
            elif save.seen:
                del self._paths[full]
                out.append(self._record("ckpt_gone", save))
        return out

    def _found_in_dir(self):
        if self.watch_dir is None:
            return []
        try:
            names = set(n for n in os.listdir(self.watch_dir) if not n.startswith(_NOT_A_SAVE))
        except OSError:  # not made yet: every entry it gets later is new
            names = set()
        if self._known_in_dir is None:
            self._known_in_dir = names
            return []
        out = []
        for name in sorted(names - self._known_in_dir, key=_by_step):
            full = os.path.join(self.watch_dir, name)
            if full in self._paths:  # the trainer's own line came first
                continue
            rec = {"k": "ckpt", "f": None, "step": step_from_path(name), "path": full,
                   "bytes": None, "watch": True, "ts": time.time()}
            self.add(rec)
            out.append(rec)
        self._known_in_dir |= names
        return out

    def _finished(self, final):
        out = []
        newest_complete = None
        for full, save in reversed(self._paths.items()):
            if save.done:
                continue
            snap = look(full, self._expected)
            steady = save.snap is not None and snap.files == save.snap.files
            if snap.whole() and (steady or final):
                out.append(self._done(save, snap, True))
                newest_complete = newest_complete or save
                if snap.is_dir:
                    self._expected = tuple(sorted(snap.files))
            elif final or (newest_complete is not None and steady and snap.exists):
                out.append(self._done(save, snap, False))  # the run ended, or a newer save won
            save.snap = snap
        return out[::-1]

    def _done(self, save, snap, complete):
        save.done = True
        if complete:
            self.complete_at = max(self.complete_at, save.start)
        rec = self._record("ckpt_done", save)
        last_write = snap.newest_mtime
        rec.update(complete=complete, bytes=snap.bytes if snap.exists else None,
                   # from the announcement (or first sight) to the last write; unknown when it
                   # was all written before rankdeck heard of it
                   seconds=round(last_write - save.start, 3) if last_write >= save.start else None)
        if not complete:
            rec["missing"] = snap.missing + [n + " (cut short)" for n in snap.broken]
        return rec

    @staticmethod
    def _record(kind, save):
        rec = save.rec
        return {"k": kind, "f": rec.get("f"), "step": rec.get("step"), "path": rec["path"],
                "ts": time.time()}


def _by_step(name):
    step = step_from_path(name)
    return (step is None, step or 0, name)
