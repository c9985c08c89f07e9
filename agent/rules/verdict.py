"""Who is stuck: one verdict from what the hosts report about their ranks (plain data, no I/O).

Input, per rank: its node, its main thread's stack (py-spy or faulthandler text) and the tail
of its flight recorder (agent/torchrun/fr_dump.py: per collective the process group, sequence number,
op, sizes, finished or not, entry time); plus the nodes that did not answer. Output::

    {"kind": "stuck-in-python" | "mismatch" | "unreachable" | "straggler" | "unknown",
     "suspects": [{"rank", "node", "frame", "source"}], "evidence": {...}, "summary": "one line"}

The rules are torch's flight-recorder analyzer's (torch.distributed.flight_recorder), cut to
the cases a live hang has: in one process group, ranks that wait in collective N while others
have finished N-1 and entered nothing since are missing from N (they are somewhere in Python:
their stack says where); ranks that all wait in N with different ops or sizes are mismatched
(the minority is named, and nobody on a tie). The analyzer itself needs torch, which the
console never imports, and all ranks' dumps on one host; docs/STUCK.md says why it is not run.

No suspect named is better than a wrong one: a rank is named only when every rank the run
knows reported a trace (or sits on a node that did not answer) and the rule is unambiguous.

A torch without a flight recorder (2.4: the hook says so, agent/torchrun/frhook.py) leaves the stacks:
:func:`from_stacks` names the ranks whose main thread is outside torch's collectives while
the others wait in one, and every such verdict says "flight recorder unavailable on torch X:
verdict from stacks alone" (its summary, ``evidence.flight_recorder``).
"""

import re
from collections import Counter
from statistics import median

from .straggler import over_median, shares

KINDS = ("stuck-in-python", "mismatch", "unreachable", "straggler", "unknown")
# torch's own frames, skipped when saying where a rank is: the user's line is the one to read.
# py-spy writes a path below sys.path relative to it ("torch/distributed/...").
_LIBRARY_PREFIXES = ("torch/", "<frozen ", "threading.py")
_LIBRARY_PARTS = ("/torch/", "/site-packages/", "/dist-packages/", "/threading.py")
SOURCE_MAX = 240  # characters of a suspect's source line
# A main thread with a frame in these waits for the other ranks (without a flight recorder, the
# stack is all there is): c10d's collectives, DDP's forward (buffer sync) and backward (its
# reducer all-reduces gradient buckets and waits for them at the end of backward).
_COLLECTIVE_PARTS = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/")
NO_RECORDER = "no_recorder"  # agent/torchrun/frhook.py's key: this torch has no flight recorder


_PYSPY_FRAME = re.compile(r"^\s+(\S+) \((.+?):(\d+)\)\s*$")
_FH_FRAME = re.compile(r'^\s+File "(.+?)", line (\d+) in (\S+)\s*$')
# escape sequences whole (CSI, OSC, a lone ESC and the character after it), then controls
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
                      r"|[\x00-\x1f\x7f-\x9f]")


def clean(text, limit):
    """Host text without control characters, cut to ``limit``: a verdict is data that a
    console shows (cleaning it again, console/lines/sanitize.py), a notification carries and a
    journal keeps."""
    text = _CONTROL.sub("", str(text))
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def rank_ranges(ranks):
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    out = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else "%d-%d" % (ordered[i], ordered[j]))
        i = j + 1
    return ",".join(out)


def main_thread_locations(stack):
    """``(function, file, line)`` of the main thread's frames, innermost first.

    Reads py-spy's dump (``Thread N (idle): "MainThread"``) and faulthandler's
    (``Current thread 0x... (most recent call first):``).
    """
    blocks = []
    for line in stack.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            blocks.append((line, []))
            continue
        if not blocks:
            continue
        m = _PYSPY_FRAME.match(line)
        if m:
            blocks[-1][1].append((m.group(1), m.group(2), int(m.group(3))))
            continue
        m = _FH_FRAME.match(line)
        if m:
            blocks[-1][1].append((m.group(3), m.group(1), int(m.group(2))))
    for header, frames in blocks:
        if '"MainThread"' in header or header.startswith("Current thread"):
            return frames
    return blocks[0][1] if blocks else []


def _is_library(path):
    return path.startswith(_LIBRARY_PREFIXES) or any(p in path for p in _LIBRARY_PARTS)


def _location(stack):
    """``(function, file, line)`` of the innermost frame of the main thread that is not
    torch's or the standard library's (the innermost of all when every frame is)."""
    frames = main_thread_locations(stack or "")
    if not frames:
        return None
    own = [f for f in frames if not _is_library(f[1])]
    return (own or frames)[0]


def frame_of(stack):
    """``file:line in function`` of the rank's own innermost frame (:func:`_location`)."""
    where = _location(stack)
    if where is None:
        return None
    fn, path, line = where
    return clean("%s:%d in %s" % (path, line, fn), limit=300)


def source_of(report):
    """The source line of the rank's own innermost frame, as its host read it (the agent's
    ``sources``: agent/torchrun/fr_dump.py), cleaned; None when the host could not read it."""
    where, sources = _location(report.get("stack")), report.get("sources")
    if where is None or not isinstance(sources, dict):
        return None
    text = sources.get("%s:%d" % (where[1], where[2]))
    text = clean(text, limit=SOURCE_MAX).strip() if isinstance(text, str) else ""
    return text or None


def _entries(report):
    """The collectives (not point-to-point) in a rank's trace whose fields have the right types."""
    fr = report.get("fr")
    if not isinstance(fr, dict) or not isinstance(fr.get("entries"), list):
        return []
    return [e for e in fr["entries"] if isinstance(e, dict) and not e.get("p2p")
            and isinstance(e.get("seq"), int) and isinstance(e.get("pg"), str)]


def _collective(entry):
    return {"pg": clean(entry["pg"], limit=40), "seq": entry["seq"],
            "op": clean(str(entry.get("op")), limit=80),
            "sizes": clean(str(entry.get("in")), limit=200)}


def _signature(entry):
    return str(entry.get("op")), str(entry.get("in")), str(entry.get("out"))


def _suspect(report):
    return {"rank": report["rank"], "node": report["node"], "frame": frame_of(report.get("stack")),
            "source": source_of(report)}


def _verdict(kind, suspects, evidence, summary):
    return {"kind": kind, "suspects": sorted(suspects, key=lambda s: s["rank"]),
            "evidence": evidence, "summary": summary}


def _unknown(why, evidence = None):
    return _verdict("unknown", [], dict(evidence or {}, why=why), "no suspect: " + why)


def _where(suspects):
    return "; ".join("rank %d on %s at %s" % (s["rank"], s["node"], s["frame"] or "?")
                     for s in suspects)


def _newest_by_group(reports):
    """{process group: {rank: that rank's newest collective in it}}."""
    groups = {}
    for r in reports:
        for e in _entries(r):
            mine = groups.setdefault(e["pg"], {})
            if r["rank"] not in mine or e["seq"] >= mine[r["rank"]]["seq"]:
                mine[r["rank"]] = e
    return groups


def _missing(by_rank, reports):
    """Ranks that finished every collective they entered while others wait in a newer one."""
    top = max(e["seq"] for e in by_rank.values())
    waiting = sorted(r for r, e in by_rank.items() if e["seq"] == top and not e.get("done"))
    behind = sorted(r for r, e in by_rank.items() if e["seq"] < top and e.get("done"))
    if not waiting or not behind or len(waiting) + len(behind) != len(by_rank):
        return None
    suspects = [_suspect(reports[r]) for r in behind]
    evidence = {"waiting_ranks": waiting, "waiting_in": _collective(by_rank[waiting[0]]),
                "suspect_last": {str(r): _collective(by_rank[r]) for r in behind}}
    w = evidence["waiting_in"]
    summary = ("rank(s) %s wait in %s #%d (pg %s); never entered by %s"
               % (rank_ranges(waiting), w["op"], top, w["pg"], _where(suspects)))
    return _verdict("stuck-in-python", suspects, evidence, summary)


def _mismatched(by_rank, reports):
    """Every rank waits in the same collective number, but not all in the same op or size."""
    seqs = {e["seq"] for e in by_rank.values()}
    if len(seqs) != 1 or any(e.get("done") for e in by_rank.values()):
        return None
    sigs = Counter(_signature(e) for e in by_rank.values())
    if len(sigs) == 1:
        return None
    (top, n1), (_, n2) = sigs.most_common(2)
    odd = sorted(r for r, e in by_rank.items() if _signature(e) != top) if n1 > n2 else []
    seq = seqs.pop()
    evidence = {"seq": seq, "collectives": {str(r): _collective(e) for r, e in sorted(by_rank.items())}}
    if not odd:
        return _verdict("mismatch", [], evidence,
                        "collective #%d differs between ranks, no majority: no suspect named" % seq)
    suspects = [_suspect(reports[r]) for r in odd]
    majority = _collective(by_rank[next(r for r in by_rank if r not in odd)])
    evidence["majority"] = majority
    summary = ("collective #%d: the others wait in %s %s; %s entered %s"
               % (seq, majority["op"], majority["sizes"], _where(suspects),
                  ", ".join(_collective(by_rank[r])["op"] for r in odd)))
    return _verdict("mismatch", suspects, evidence, summary)


def _unreachable(reports, unreachable, expected):
    lost = sorted(r for r, node in expected.items() if node in unreachable)
    if not lost:
        return None
    waiting = sorted(r["rank"] for r in reports
                     if any(not e.get("done") for e in _entries(r)[-1:]))
    suspects = [{"rank": r, "node": expected[r], "frame": None, "source": None} for r in lost]
    evidence = {"unreachable": {n: clean(str(c), limit=200) for n, c in sorted(unreachable.items())},
                "waiting_ranks": waiting}
    summary = "%s unreachable (%s); rank(s) %s wait on them" % (
        ", ".join(sorted(unreachable)), "; ".join(evidence["unreachable"].values()),
        rank_ranges(waiting) or "none")
    return _verdict("unreachable", suspects, evidence, summary)


def lateness(reports):
    """Per rank, seconds it entered each collective after the median rank did (one sample per
    collective every rank recorded)."""
    times = _entry_times(reports)
    out = {rank: [] for rank in times}
    for key in set.intersection(*(set(t) for t in times.values())) if times else ():
        mid = median(t[key] for t in times.values())
        for rank, t in times.items():
            out[rank].append((t[key] - mid) / 1e6)
    return out


def _entry_times(reports):
    """{rank: {(pg, seq): entry time in us}}, the shape agent/rules/straggler.py reduces."""
    return {r["rank"]: {(e["pg"], e["seq"]): e["t_ns"] // 1000 for e in _entries(r)
                        if isinstance(e.get("t_ns"), int) and e["t_ns"] > 0}
            for r in reports}


def straggler(reports):
    """The one rank the others wait for, by the continuous detector's rule
    (agent/rules/straggler.py) applied to one sample: its share of the others' wait is above the
    median rank's by ``SHARE_MIN`` and by 5 x the MAD of all ranks' shares. A share, not a
    lateness in ms: a rank 18 ms late in 100 ms steps on a loaded core is noise, one 1 s late
    in them is the job's bottleneck."""
    found = shares(_entry_times(reports))
    if found is None:
        return None
    margins, bar = over_median(found)
    worst = max(margins, key=margins.get)
    if margins[worst] < bar:
        return None
    late = {r: median(v) for r, v in lateness(reports).items()}
    report = next(r for r in reports if r["rank"] == worst)
    evidence = {"lateness_s": {str(r): round(v, 4) for r, v in sorted(late.items())},
                "share": {str(r): round(v, 3) for r, v in sorted(found.items())}}
    return _verdict("straggler", [_suspect(report)], evidence,
                    "rank %d on %s enters collectives %.0f ms after the others (median); "
                    "they wait for it %.0f%% of the time"
                    % (worst, report["node"], (late[worst] - median(late.values())) * 1000,
                       found[worst] * 100))


def _progressed(earlier, reports):
    """Ranks whose newest collective changed between two samples: not hung."""
    def newest(rs):
        return {r["rank"]: max((e["seq"] for e in _entries(r)), default=None) for r in rs}
    before, now = newest(earlier), newest(reports)
    return sorted(r for r in now if r in before and now[r] != before[r])


def decide(reports, unreachable = None,
           expected = None, earlier = None):
    """The verdict for one moment of a run.

    ``reports``: one dict per rank that answered (``rank``, ``node``, ``stack``, ``fr``).
    ``unreachable``: node -> cause, for nodes that did not answer. ``expected``: rank -> node
    for every rank the run knows (RunState), so a rank that did not report is noticed.
    ``earlier``: the same ranks' reports a moment before; a healthy job caught between two
    collectives looks like a hang in one sample, so with two, a rank that moved on means
    nobody is stuck (only a straggler can be named then).
    """
    unreachable = unreachable or {}
    expected = dict(expected or {})
    by_rank = {r["rank"]: r for r in reports}
    for r in reports:
        expected.setdefault(r["rank"], r["node"])
    lost = _unreachable(reports, unreachable, expected)
    if lost:
        return lost
    silent = sorted(set(expected) - set(by_rank))
    if silent:
        return _unknown("rank(s) %s did not report" % rank_ranges(silent))
    versions = _without_recorder(reports)
    if versions:
        return from_stacks(reports, earlier, versions)
    no_trace = sorted(r["rank"] for r in reports if not _entries(r))
    if no_trace:
        errors = {str(r["rank"]): clean(str((r.get("fr") or {}).get("error", "empty trace")), limit=200)
                  for r in reports if r["rank"] in no_trace}
        return _unknown("no flight-recorder trace from rank(s) %s" % rank_ranges(no_trace),
                        {"trace_errors": errors})
    moving = _progressed(earlier, reports) if earlier is not None else []
    if moving:
        return straggler(reports) or _unknown("no hang: rank(s) %s entered new collectives "
                                              "between two samples" % rank_ranges(moving))
    for _pg, newest in sorted(_newest_by_group(reports).items()):
        if set(newest) != set(by_rank):
            continue  # a subgroup: the default group is where every rank meets
        found = _missing(newest, by_rank) or _mismatched(newest, by_rank)
        if found:
            return found
    return straggler(reports) or _unknown("every rank is in step with the others in every "
                                          "collective (no hang found in the traces)")


# -- without a flight recorder ------------------------------------------------------------------
def _without_recorder(reports):
    """The torch versions whose ranks said they have no flight recorder (agent/torchrun/frhook.py)."""
    return sorted({clean(r["fr"][NO_RECORDER], limit=40) for r in reports
                   if isinstance(r.get("fr"), dict) and isinstance(r["fr"].get(NO_RECORDER), str)})


def _in_collective(frames):
    """Whether the library frames the main thread is in, innermost first down to the first
    frame of the rank's own code, include a collective's. Only those: torch's frames further
    out (torchrun's ``@record`` wrapper around ``main``) say nothing of where the rank waits."""
    for _fn, path, _line in frames:
        if not _is_library(path):
            return False
        if path.startswith(_COLLECTIVE_PARTS) or any("/" + p in path for p in _COLLECTIVE_PARTS):
            return True
    return False


def from_stacks(reports, earlier, versions):
    """The verdict from the main threads' stacks alone, for a torch with no flight recorder.

    Named, as ``stuck-in-python``: the ranks outside any collective (:func:`_in_collective`)
    while the others wait in one, only when every rank's main thread stood still between the
    two samples (``earlier``) and the ranks outside are fewer than those waiting. Without the
    recorder a mismatch (every rank waits, in different collectives) or a straggler cannot be
    seen: those are ``unknown``, saying why.
    """
    note = "flight recorder unavailable on torch %s: verdict from stacks alone" % ", ".join(versions)
    evidence = {"flight_recorder": note}

    def unknown(why):
        return _verdict("unknown", [], dict(evidence, why=why), "%s; no suspect: %s" % (note, why))

    frames = {r["rank"]: main_thread_locations(r.get("stack") or "") for r in reports}
    blank = sorted(rank for rank, f in frames.items() if not f)
    if blank:
        return unknown("no stack from rank(s) %s" % rank_ranges(blank))
    if earlier is None:
        return unknown("one sample only: a rank standing still cannot be told from one passing by")
    before = {r["rank"]: main_thread_locations(r.get("stack") or "") for r in earlier}
    moved = sorted(rank for rank, f in frames.items() if before.get(rank) != f)
    if moved:
        return unknown("rank(s) %s moved between two samples (no hang seen)" % rank_ranges(moved))
    waiting = sorted(rank for rank, f in frames.items() if _in_collective(f))
    outside = sorted(rank for rank in frames if rank not in waiting)
    if not waiting or not outside:
        return unknown("every rank is %s a collective: without the recorder a mismatch or a "
                       "missing peer cannot be told" % ("in" if waiting else "outside"))
    if len(outside) >= len(waiting):
        return unknown("rank(s) %s wait in a collective, as many or more (%s) are outside one: "
                       "no majority to go by" % (rank_ranges(waiting), rank_ranges(outside)))
    by_rank = {r["rank"]: r for r in reports}
    suspects = [_suspect(by_rank[rank]) for rank in outside]
    at = frames[waiting[0]][0]
    evidence.update(waiting_ranks=waiting,
                    waiting_at=clean("%s:%d in %s" % (at[1], at[2], at[0]), limit=300))
    return _verdict("stuck-in-python", suspects, evidence,
                    "%s; rank(s) %s wait in a collective (at %s); outside any: %s"
                    % (note, rank_ranges(waiting), evidence["waiting_at"], _where(suspects)))
