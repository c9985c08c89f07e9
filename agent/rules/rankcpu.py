"""Is a rank that prints nothing working? Its worker's CPU time, from the supervisors'
periodic samples (agent/supervisor/ranksample.py). Plain data; one rule, applied by the run's judge
(agent/rules/judge.py, in its own clock) and by a console with no judge (console/judgement/local_judge.py,
console/model/ranks.py). Standard library only; Python >= 3.9.

The rule (docs/STATUS.md, ``ranks[].silent``):
- a rank's CPU *advances* in a sample when its worker (the same pid as in the sample
  before) used at least ``CPU_MIN_SHARE`` of a core since then, the flight-recorder dump the
  sample asked for left out (``cpu_after_s``; a sample marked ``rebase`` follows a dump
  answered too late to leave out, and counts as no evidence either way);
- a silent rank still ``starting`` whose CPU advances is ``running``;
- in a run where no rank prints steps, the run stalls when no rank's CPU has advanced for
  longer than the stall threshold, and runs again when one does. That long is measured
  between samples (the newest sample against the last one that saw CPU advance), never
  against a clock between them: with samples every 10 s and a threshold of 6, a busy run
  would look idle 6 s after each sample. And only once the run is past its start: a rank's
  sample listed a collective it entered (its flight recorder), or the rank cannot tell
  (no hook, a torch without a recorder). Before that, a run that will print steps prints
  none yet, and its ranks idle in the rendezvous and ``init_process_group`` for as long as
  the slowest node takes. A rank blocked in a gloo
  collective uses almost no CPU, so one rank's idle CPU never stalls that rank alone: a
  healthy job with a straggler has its fast ranks idle, waiting. The limit of the rule: a
  hung rank that spins in Python keeps a silent run ``running``.
"""

from .kinds import finite, whole

CPU_MIN_SHARE = 0.02  # of one core, over a sample period
# a sample's fr_error saying the rank cannot list its collectives at all (agent/torchrun/fr_dump.py,
# agent/torchrun/frhook.py): its CPU alone is the evidence, as before the flight recorder
CANNOT_TELL = ("no flight-recorder hook", "this torch has no flight recorder")
MOST = 2.0 ** 40  # seconds (CPU or since 1970), ids: past this a value is garbage


class RankCpu:
    """Fed the ``sample`` records of every node; says whose CPU advanced, and when last."""

    def __init__(self):
        self._last = {}  # rank -> (pid, cpu seconds)
        self.advanced_at = {}  # rank -> when its CPU last advanced
        self.sampled_at = {}  # rank -> when its newest sample came
        self.past_start = set()  # ranks that entered a collective (or cannot tell)

    def add(self, meta, at=None):
        """One node's sample; the ranks whose CPU advanced since their previous sample.
        ``at``: when, in the applier's clock (the judge's: when the sample arrived); by
        default the sample's own ``ts``."""
        ts, period = meta.get("ts"), meta.get("period")
        if not (_number(ts) and _number(period) and period > 0):
            return []
        moved = []
        for rank in meta.get("ranks") if isinstance(meta.get("ranks"), list) else []:
            if not isinstance(rank, dict):
                continue
            r, pid, cpu = rank.get("rank"), rank.get("pid"), rank.get("cpu_s")
            if not (_whole(r) and _whole(pid) and _number(cpu)):
                continue
            before = self._last.get(r)
            self.sampled_at[r] = ts if at is None else at
            if rank.get("fr") or str(rank.get("fr_error")).startswith(CANNOT_TELL):
                self.past_start.add(r)
            after = rank.get("cpu_after_s")  # the flight-recorder dump is not the rank's work
            self._last[r] = (pid, float(after if _number(after) else cpu))
            if (before is not None and before[0] == pid and rank.get("rebase") is not True
                    and cpu - before[1] >= CPU_MIN_SHARE * period):
                self.advanced_at[r] = ts if at is None else at
                moved.append(r)
        return moved

    def sampled_idle_s(self, ranks):
        """How long the samples of ``ranks`` have shown no CPU advancing: from the last one
        that did to the newest; None before one ever did or before the run is past its start."""
        seen = [self.advanced_at[r] for r in ranks if r in self.advanced_at]
        if not seen or not any(r in self.past_start for r in ranks):
            return None
        return max(self.sampled_at[r] for r in ranks if r in self.sampled_at) - max(seen)

    def cpu_s(self, rank):
        last = self._last.get(rank)
        return None if last is None else last[1]


def silent_run_idle_s(ranks, rank_cpu, threshold):
    """In a run where no rank prints steps (``ranks``: rank -> an object with ``reports``),
    how long its samples have shown no rank's CPU advancing, once that is past
    ``threshold``; else None."""
    if any(r.reports for r in ranks.values()):
        return None
    idle = rank_cpu.sampled_idle_s(list(ranks))
    return idle if idle is not None and idle > threshold else None


def stall_text(rank, idle):
    return ("rank %d stalled: the run prints no steps and no rank's CPU has advanced for %.0f s"
            % (rank, idle))


AGAIN_TEXT = "running again (it prints no steps; its CPU advances)"


def _whole(value):
    return whole(value, MOST)


def _number(value):
    """A number in [0, MOST]: not NaN nor infinite (a host's NaN would stall or wake the
    run for ever, and is not JSON in ``status --json``)."""
    return finite(value) and 0 <= value <= MOST
