"""The supervisor's periodic sample of its ranks while the run lives: CPU time and process
state of every worker, and when each entered its newest collectives (the flight recorder,
read through the hook: agent/torchrun/frhook.py, agent/torchrun/fr_dump.py).

One ``k: sample`` journal record a period (``RANKDECK_SAMPLE_S`` in the run's env, default
10 s, from 1 s to an hour; 0 switches it off)::

    {"k": "sample", "ts": time.time(), "tick": int, "period": float,
     "ranks": [{"rank", "pid", "cpu_s": user+system seconds, "state": "R"|"S"|"D"|...,
                "cpu_after_s": the same once the rank answered (the dump's own CPU),
                "fr": [[pg, seq, t_us], ...] (newest KEEP collectives) | absent,
                "fr_error": why (absent when "fr" is there)}]}

The console reads it for stragglers (agent/rules/straggler.py: who enters collectives last) and
for ranks that print nothing (agent/rules/rankcpu.py: is their CPU advancing).

Samples are taken on wall-clock ticks (``tick = int(time.time() // period)``), so every node
samples within a few tens of milliseconds of the others and their newest collectives are
mostly the same ones; the console compares ranks across nodes tick by tick. Asking the hook
does not block the supervisor's loop: the request goes out at the tick and the answers are
collected on the following passes, at most ``ANSWER_WAIT`` seconds.
"""

import os
import time

from ..torchrun import fr_dump
from ..host import procs
from ..torchrun.stacks import workers

PERIOD_VAR = "RANKDECK_SAMPLE_S"
DEFAULT_PERIOD = 10.0
MIN_PERIOD = 1.0  # each sample makes every rank dump its flight recorder: not every pass
MAX_PERIOD = 3600.0
KEEP = 64  # collectives a rank, a sample: a few KB a node a period
ANSWER_WAIT = 3.0
LATE_SAMPLES = 2  # samples marked ``rebase`` after an unanswered dump (it may answer later)
# Finding the workers reads every process on the host (agent/torchrun/stacks.py ``workers``): milliseconds
# on a quiet machine, tens of them on a busy host, once a sample. The ones found are sampled
# again while all of them live and they are as many as their LOCAL_WORLD_SIZE, and looked for
# afresh at least this often (a worker that came without another going).
FIND_EVERY = 60.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def period_of(env):
    """Seconds between samples from the run's env, within [MIN_PERIOD, MAX_PERIOD]; 0 (off)
    for 0 or less and for a value that is not a finite number."""
    try:
        period = float(env.get(PERIOD_VAR, DEFAULT_PERIOD))
    except (TypeError, ValueError):
        return 0.0
    if not period > 0 or period == float("inf"):  # NaN too
        return 0.0
    return min(MAX_PERIOD, max(MIN_PERIOD, period))


def cpu_seconds(pid):
    """User + system CPU seconds of ``pid`` (all its threads), or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()
    return round((int(fields[11]) + int(fields[12])) / float(_CLK_TCK), 2)


def entry_times(trace):
    """``[[pg, seq, t_us], ...]``: the newest KEEP collectives of a trace (not point-to-point)."""
    out = []
    for e in trace.get("entries") or []:
        t_ns, seq = e.get("time_created_ns"), e.get("collective_seq_id")
        if e.get("is_p2p") or not isinstance(t_ns, int) or not isinstance(seq, int):
            continue
        out.append([str(e.get("pg_id")), seq, t_ns // 1000])
    return out[-KEEP:]


class RankSampler:
    """Called from the supervisor's loop (``tick``); journals one record a period."""

    def __init__(self, journal, node_dir, period, clock=time.time):
        self._journal = journal
        self._fr_dir = os.path.join(node_dir, "fr")
        self._period = period
        self._clock = clock
        self._last_tick = None
        self._pending = None  # (record, {rank: asked}, deadline) while answers come in
        # pid -> samples left to mark: a rank that answered its dump after ANSWER_WAIT spent
        # that CPU after cpu_after_s could be read; its next samples say so (``rebase``)
        self._late = {}
        self._found = []  # [(worker, its start time)]: the workers the last search found
        self._found_at = None  # time.monotonic() of that search

    def tick(self):
        if not self._period:
            return
        if self._pending is not None:
            self._collect()
            return
        tick = int(self._clock() // self._period)
        if tick != self._last_tick:
            self._last_tick = tick
            self._start(tick)

    def _workers(self):
        """``[(worker, ProcInfo)]``: the workers found last time while they all still run
        (same start time, not a zombie) and are as many as they were launched, else a search."""
        if self._found and time.monotonic() - self._found_at < FIND_EVERY:
            infos = [procs.stat(w["pid"]) for w, _start in self._found]
            if all(info is not None and info.starttime == start and info.state != "Z"
                   for info, (_w, start) in zip(infos, self._found)) \
                    and len(self._found) >= max(w["local_world_size"] for w, _s in self._found):
                return [(w, info) for (w, _s), info in zip(self._found, infos)]
        self._found_at = time.monotonic()
        found = [(w, procs.stat(w["pid"])) for w in workers(os.getpid())]
        found = [(w, info) for w, info in found if info is not None]
        self._found = [(w, info.starttime) for w, info in found]
        return found

    def _start(self, tick):
        ranks, asked = [], {}
        for w, info in self._workers():
            rank = {"rank": w["rank"], "pid": w["pid"], "cpu_s": cpu_seconds(w["pid"]),
                    "state": info.state if info else "?"}
            if self._late.get(w["pid"]):
                rank["rebase"] = True  # its CPU since the last sample holds a late dump
                self._late[w["pid"]] -= 1
            try:
                ask = fr_dump.ask(self._fr_dir, w["pid"])
            except OSError as exc:
                ask = {"error": str(exc)}
            if "error" in ask:
                rank["fr_error"] = ask["error"]
            else:
                asked[w["rank"]] = (w["pid"], ask)
            ranks.append(rank)
        if not ranks:
            return  # no worker yet (rendezvous) or any more: nothing to say
        record = {"k": "sample", "ts": self._clock(), "tick": tick, "period": self._period,
                  "ranks": ranks}
        self._pending = (record, asked, time.monotonic() + ANSWER_WAIT)
        self._collect()

    def _collect(self):
        record, asked, deadline = self._pending
        for rank in record["ranks"]:
            pid_ask = asked.get(rank["rank"])
            if pid_ask is None:
                continue
            trace = fr_dump.answer(self._fr_dir, pid_ask[0], pid_ask[1])
            if trace is not None:
                del asked[rank["rank"]]
                # the dump is CPU the rank spent for us: the console leaves it out
                rank["cpu_after_s"] = cpu_seconds(pid_ask[0])
                if "error" in trace:
                    rank["fr_error"] = str(trace["error"])[:300]
                else:
                    rank["fr"] = entry_times(trace)
        if asked and time.monotonic() < deadline:
            return
        self._late = {pid: n for pid, n in self._late.items() if n > 0}
        for rank in record["ranks"]:
            if rank["rank"] in asked:
                rank["fr_error"] = "the rank did not answer within %.0f s" % ANSWER_WAIT
                self._late[rank["pid"]] = LATE_SAMPLES
        self._pending = None
        self._journal.append(record)
