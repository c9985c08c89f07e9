"""Checkpoints a worker announced that have disappeared since: the trainer deleted them.

Trainers that keep only their newest checkpoints (Hugging Face ``save_total_limit``, the
reference trainer's ``--keep-ckpts``, Lightning's ``save_top_k``) delete older ones without a
line saying so. The supervisor hands every ``ckpt`` record it journals to
:meth:`CheckpointWatch.add` and, once in a while, journals what :meth:`CheckpointWatch.gone`
returns: a ``ckpt_gone`` record per announced path that existed and exists no longer.

A path is reported only after it was once seen on disk: Hugging Face prints "Saving model
checkpoint to X" before it writes X. Relative paths are the worker's, read against torchrun's
working directory. Standard library only; runs on Python >= 3.8.
"""

import collections
import os
import time

CHECK_EVERY = 5.0  # seconds between two looks at the disk
WATCHED = 256  # newest announced paths looked at; older ones are left alone


class CheckpointWatch(object):
    def __init__(self, cwd, every=CHECK_EVERY, watched=WATCHED):
        self.cwd = cwd
        self.every = every
        self.watched = watched
        # absolute path -> [the ckpt record, seen on disk yet]
        self._paths = collections.OrderedDict()
        self._next = 0.0

    def add(self, rec):
        """A ``ckpt`` record the supervisor journaled (``path`` as the worker printed it)."""
        path = rec.get("path")
        if not path:
            return
        full = os.path.join(self.cwd, os.path.expanduser(path))
        self._paths.pop(full, None)
        self._paths[full] = [rec, os.path.lexists(full)]
        while len(self._paths) > self.watched:
            self._paths.popitem(last=False)

    def gone(self, force=False):
        """``ckpt_gone`` records (``f``, ``step``, ``path``, ``ts``) for announced paths that
        disappeared; looks at most every ``every`` seconds unless ``force``."""
        now = time.monotonic()
        if not self._paths or (not force and now < self._next):
            return []
        self._next = now + self.every
        out = []
        for full, entry in list(self._paths.items()):
            rec, seen = entry
            if os.path.lexists(full):
                entry[1] = True
            elif seen:
                del self._paths[full]
                out.append({"k": "ckpt_gone", "f": rec.get("f"), "step": rec.get("step"),
                            "path": rec["path"], "ts": time.time()})
        return out
