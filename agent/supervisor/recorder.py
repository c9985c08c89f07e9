"""What torchrun and its workers write, recorded: masked, parsed and appended to the journal.

The supervisor (agent/supervisor/supervisor.py) owns torchrun's lifetime: it starts, kills and reaps
it (agent/supervisor/launcher.py), and it owns the journal and the file follower (it opens
and closes them). This module only records: each turn :meth:`Recorder.pump` takes what the
follower read (agent/host/tail.py), masks the data with the run's secrets (the supervisor's
agent/rules/mask.py Masker), keeps which worker each file belongs to and the last bytes of each
worker's stderr, turns torchrun's "failed (exitcode: N)" lines into ``worker_failed`` events
(agent/torchrun/worker_exit.py), parses metrics, checkpoints and resume lines (agent/formats/metrics.py,
agent/formats/resumed.py), and journals it all. Saves found complete, deleted or new in
``--checkpoint-dir`` come from agent/formats/ckpt_watch.py.

Which torchrun start is current, and where a parser's failure is logged, are the supervisor's
to know: it hands them in as callables (``current_instance``, ``log``), so this module never
imports the supervisor.
"""

import time

from ..torchrun import worker_exit
from ..formats.ckpt_watch import CheckpointWatch
from ..formats.metrics import MetricParser
from ..formats.resumed import resumed_records

STDERR_TAIL = 16 * 1024  # bytes of each worker's stderr kept for the cause of a failure


class Recorder:
    """One node's recording: ``journal`` (agent/host/journal.py JournalWriter), ``follower``
    (agent/host/tail.py LogFollower) and ``masker`` (agent/rules/mask.py, the run's secrets; the
    follower cuts data where it splits no secret) are the supervisor's; ``metrics_regex``
    the user's ``--metrics-regex`` or None; ``workdir`` where relative checkpoint paths are
    read; ``checkpoint_dir`` the ``--checkpoint-dir`` to watch or None.
    ``current_instance()`` names torchrun's current ``<rdzv-id>_<random8>`` log folder (or
    None); ``log(text)`` writes a line to supervisor.log."""

    def __init__(self, journal, follower, masker, node, metrics_regex, workdir,
                 checkpoint_dir, current_instance, log):
        self.journal = journal
        self.follower = follower
        self.masker = masker  # on data records, before the journal
        self.node = node
        self.parser = MetricParser(metrics_regex)
        # complete? deleted later? (and new entries of --checkpoint-dir)
        self.checkpoints = CheckpointWatch(workdir, watch_dir=checkpoint_dir)
        self.current_instance = current_instance
        self.log = log
        self.ranks = {}  # fid -> (rank, local_rank, attempt, instance, stream)
        self.stderr_tails = {}  # fid -> the last bytes of a worker's stderr

    # -- events ----------------------------------------------------------------------------
    def event(self, what, **fields):
        """Journal the supervisor's event ``what`` (launched, stopping, killed, ended...)."""
        self.journal.append(self.event_record(what, **fields))

    def event_record(self, what, **fields):
        fields.update(k="event", what=what, ts=time.time(), node=self.node)
        return fields

    # -- what the files say ----------------------------------------------------------------
    def pump(self, final=False):
        """Journal what the ranks and torchrun wrote since the last turn; the bytes read."""
        records = self.follower.poll(final=final)
        if not records:
            return 0
        out = []
        for meta, data in records:
            kind = meta["k"]
            if kind == "data":
                data = self.masker.mask(data)
            out.append((meta, data))
            if kind == "file":
                self.ranks[meta["f"]] = (meta.get("rank"), meta.get("local_rank"),
                                         meta.get("attempt"), meta.get("instance"),
                                         meta.get("stream"))
            elif kind == "data" and data and meta["f"] in self.ranks \
                    and self.ranks[meta["f"]][4] == "torchrun":
                out.extend((rec, b"") for rec in self.worker_failures(data))
            elif kind == "data" and data and self._is_worker(meta["f"]):
                out.extend((rec, b"") for rec in self._worker_output(meta, data))
        self.journal.append_many(out)
        return sum(len(data) for _meta, data in records)

    def _worker_output(self, meta, data):
        """The records parsed from a worker's (masked) bytes; its stderr's tail kept."""
        if self.ranks[meta["f"]][4] == "stderr":
            tail = self.stderr_tails.get(meta["f"], b"") + data
            self.stderr_tails[meta["f"]] = tail[-STDERR_TAIL:]
        text = data.decode("utf-8", "surrogateescape")
        try:
            # the worker (local rank, attempt, instance) ties its stdout to its stderr
            parsed = self.parser.parse(text, meta["f"], self.ranks[meta["f"]][1:4])
            parsed += resumed_records(text, self.parser.mentioned)
        except Exception as exc:  # a parser bug must never stop the journal
            parsed = []
            self.log("metrics parser failed: %r" % (exc,))
        for rec in parsed:
            rec["f"] = meta["f"]
            rec["ts"] = meta["ts"]
            if rec["k"] == "ckpt":
                self.checkpoints.add(rec)
        return parsed

    def worker_failures(self, data):
        """``worker_failed`` events for the failures torchrun reports in its own output
        (agent/torchrun/worker_exit.py): which rank, which exit code or signal."""
        out = []
        for code, local_rank, pid in worker_exit.failures(data.decode("utf-8", "replace")):
            fid, attempt = self.stderr_of(self.current_instance(), local_rank)
            rank = self.ranks[fid][0] if fid is not None else None
            out.append(self.event_record("worker_failed", rank=rank, local_rank=local_rank,
                                         attempt=attempt, pid=pid, exit_code=code))
        return out

    def deleted_checkpoints(self, final=False):
        """Journal ``ckpt_done`` for saves found complete (or, final, not), ``ckpt_gone`` for
        ones the trainer deleted, ``ckpt`` for new entries of --checkpoint-dir."""
        found = self.checkpoints.poll(final=final)
        if found:
            self.journal.append_many([(rec, b"") for rec in found])

    # -- what was recorded, for the cause of a failure -------------------------------------
    def _is_worker(self, fid):
        return _worker_file(self.ranks.get(fid))

    def files_by_rank(self):
        """{fid: rank} of the workers' files so far (asked from the judge link's thread)."""
        return {fid: info[0] for fid, info in list(self.ranks.items()) if _worker_file(info)}

    def stderr_of(self, inst, local_rank):
        """(fid, attempt) of ``local_rank``'s newest stderr file in torchrun start ``inst``."""
        best = (None, None)
        for fid, (_r, lr, att, ins, stream) in sorted(self.ranks.items()):
            if ins == inst and lr == local_rank and stream == "stderr":
                best = (fid, att)
        return best

    def stderr_tail(self, fid):
        """The last bytes (up to STDERR_TAIL) file ``fid`` held, as text; "" when none."""
        return self.stderr_tails.get(fid, b"").decode("utf-8", "replace")

    def rank_of(self, inst, local_rank, attempt):
        """The global rank of ``local_rank``'s files in ``attempt`` of ``inst``, or None."""
        rank = None
        for r, lr, att, ins, _stream in self.ranks.values():
            if lr == local_rank and att == attempt and ins == inst:
                rank = r
        return rank


def _worker_file(info):
    """A rank's file, by its ``(rank, local_rank, ...)``: torchrun's (a local rank) or
    DeepSpeed's (the global rank its name gives, no local rank: agent/host/tail.py); not torchrun's
    or the launcher's own log."""
    return info is not None and (info[1] is not None or info[0] is not None)
