"""Metric and checkpoint events parsed out of a rank's log text.

The run supervisor feeds every chunk it reads from a worker's log file to
:meth:`MetricParser.parse`, naming the file and the worker. Formats, one parser per trainer
family (each module says exactly which lines it reads; docs/METRICS.md shows a real one):

* :mod:`agent.formats.hf`: Hugging Face Trainer dict lines, its tqdm bar, its checkpoints;
* :mod:`agent.formats.lightning`: PyTorch Lightning's tqdm bar and the metrics shown in it;
* :mod:`agent.formats.launchers`: torchtitan, Megatron-LM and DeepSpeed summary lines;
* :mod:`agent.formats.plain`: rankdeck's reference trainer, ``key=value`` prints (accelerate
  scripts and most hand-written loops) and the reference checkpoint line;
* a user regex, when given, tried first on every line.

Nothing is configured: each file tries the families in turn on its lines and keeps first the
one that matched last, so a file settles on its trainer's family after its first metric line
and other families are only tried on lines that one does not read. The step is always the
trainer's own (a Hugging Face dict line takes the step of its progress bar), never a count.

Chunks arrive at up to ~100k lines/s per node, so the common case (no metrics at all) costs a
lower-cased copy and a few substring scans of the chunk, and only lines that mention a
keyword reach Python. Patterns stay linear on hostile input (long digit or blank runs): a log
line must never stall the supervisor. Standard library only; runs on Python >= 3.8.
"""

import math
import re

from .hf import HuggingFaceFamily
from .launchers import DeepSpeedFamily, MegatronFamily, TorchtitanFamily
from .lightning import LightningFamily
from .plain import REFERENCE, PlainFamily, reference_record
from .values import INT_MAX, METRIC_FIELDS, convert

__all__ = ["MetricParser", "MAX_LINE", "METRIC_FIELDS", "FAMILIES"]

#: Lines longer than this are skipped: no trainer prints a metric line this long.
MAX_LINE = 64 * 1024

#: Families in the order an undecided file tries them: the specific ones first, plain last.
FAMILIES = (HuggingFaceFamily, LightningFamily, TorchtitanFamily, MegatronFamily,
            DeepSpeedFamily, PlainFamily)

_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_TRIGGERS = {}


def _keywords():
    seen = []
    for family in FAMILIES:
        for kw in family.keywords:
            if kw not in seen:
                seen.append(kw)
    return tuple(seen)


# A line is worth a look only if it mentions one of these (case-insensitively). Plain
# substring tests and a literal alternation keep the regex engine on its fast paths; an
# IGNORECASE alternation scans ~10x slower.
_KEYWORDS = _keywords()


def keywords_in(low):
    """The keywords (in ``_KEYWORDS`` order) that ``low``, lower-cased log text, mentions.

    A scan of the whole chunk each, but a tqdm rate's (``it/s``, ``s/it``) only when the
    chunk has a ``/`` at all: that test runs at memchr's speed, and plain lines mostly have
    none, so such a chunk costs four scans instead of six. These scans were most of the
    supervisor's CPU a line (docs/BENCHMARKS.md, "Ingest")."""
    slash = "/" in low
    return tuple(kw for kw in _KEYWORDS if (slash or "/" not in kw) and kw in low)


def _compile_user_regex(user_regex):
    if isinstance(user_regex, type(REFERENCE)):
        rx = user_regex
    else:
        try:
            rx = re.compile(user_regex)
        except (re.error, TypeError) as exc:
            raise ValueError("invalid metrics regex %r: %s" % (user_regex, exc)) from exc
    fields = tuple(name for name in METRIC_FIELDS if name in rx.groupindex)
    if not fields:
        raise ValueError(
            "metrics regex %r has no named group among %s; write e.g. (?P<loss>[0-9.eE+-]+)"
            % (rx.pattern, ", ".join(METRIC_FIELDS))
        )
    return rx, fields


class MetricParser:
    """Turns chunks of log text into ``metric`` and ``ckpt`` records.

    ``user_regex``: a pattern with named groups among step, loss, lr, step_time, tok_s,
    samples_s, tflops (others are ignored), searched on every line first. Raises ValueError if
    it does not compile or names none of those groups.
    """

    def __init__(self, user_regex=None):
        self._user = None
        self._user_fields = ()
        if user_regex is not None and user_regex != "":
            self._user, self._user_fields = _compile_user_regex(user_regex)
        self._families = [family() for family in FAMILIES]
        # what a family does once a chunk is read (a dict that waited for its bar's step)
        self._chunk_ends = [f.chunk_end for f in self._families if hasattr(f, "chunk_end")]
        self._files = {}  # file -> _FileFormats
        self._workers = {}  # worker -> {family name: that family's state for the worker}
        # the keywords the last parsed text mentions (case-insensitively), or None when its
        # lines were all read (a user regex, a Hugging Face bar): agent/formats/resumed.py asks it
        self.mentioned = None

    def family_of(self, file=None):
        """The name of the family ``file`` settled on, or None while none has matched."""
        formats = self._files.get(file)
        return formats.settled if formats is not None else None

    def forget(self, file):
        """Drop what is kept for a file that will not be read again."""
        self._files.pop(file, None)

    def parse(self, text, file=None, worker=None):
        """Records found in ``text``, in order of appearance.

        ``file`` names the log file the text comes from (each file settles on a family) and
        ``worker`` the process that writes it (its stdout and stderr files share what a family
        learns, e.g. the Hugging Face bar's step); both default to one anonymous source.
        ``{"k": "metric", "step": int|None, "loss"|"lr"|"step_time"|"tok_s"|"samples_s"|
        "tflops": float, ...}`` (only the fields found) and ``{"k": "ckpt", "step": int,
        "path": str, "bytes": int|None}``. Never raises on junk: lone surrogates, binary, NaN,
        huge lines (skipped).
        """
        out = []
        self.mentioned = None
        if not text:
            return out
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "surrogateescape")
        elif not isinstance(text, str):
            return out
        order = self._files.get(file)
        if order is None:
            order = self._files[file] = _FileFormats(self._families)
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = {}
        if self._user is None and not ("hf" in state and "\r" in text):
            self._parse_lines_with_trigger(text, order, state, out)
        else:
            # A user regex sees every line; so does a Hugging Face worker's bar output, whose
            # clears (blanks between two \r) hold no keyword but pair dicts with steps.
            self._parse_every_line(text, order, state, out)
        for chunk_end in self._chunk_ends:
            chunk_end(state, out)
        for rec in out:
            if "_bar" in rec:
                del rec["_bar"]
            within_bounds(rec)
        return out

    # -- line selection -------------------------------------------------------------------

    def _parse_lines_with_trigger(self, text, order, state, out):
        # Lines without a keyword are skipped by C-level substring scans and one regex
        # search per interesting line, never by a Python loop over lines.
        low = text.lower()
        if len(low) != len(text):
            # A few non-ASCII characters lower-case to two (U+0130); offsets would drift.
            low = text.translate(_ASCII_LOWER)
        present = self.mentioned = keywords_in(low)
        if not present:
            return
        trigger = _TRIGGERS.get(present)
        if trigger is None:
            trigger = _TRIGGERS[present] = re.compile("|".join(re.escape(kw) for kw in present))
        search = trigger.search
        reference = REFERENCE.match
        find = low.find
        rfind = low.rfind
        size = len(text)
        pos = 0
        while True:
            m = search(low, pos)
            if m is None:
                return
            hit = m.start()
            start = rfind("\n", 0, hit) + 1
            end = find("\n", hit)
            if end < 0:
                end = size
            pos = end + 1
            if end - start > MAX_LINE:
                continue
            ref = reference(text, hit, end)
            if ref is not None and (hit == 0 or not _is_key_char(text[hit - 1])):
                out.append(reference_record(ref))
                continue
            line = text[start:end]
            if "\r" in line:
                # tqdm redraws with a bare \r, so one "line" of a log file holds many outputs;
                # the last piece is the end of the line, not a bar clear.
                pieces = line.split("\r")
                last = len(pieces) - 1
                for i, piece in enumerate(pieces):
                    if piece and (i < last or not piece.isspace()):
                        self._segment(piece, order, state, out)
            else:
                self._segment(line, order, state, out)

    def _parse_every_line(self, text, order, state, out):
        search_user = self._user.search if self._user is not None else _no_match
        for line in text.split("\n"):
            if not line or len(line) > MAX_LINE:
                continue
            pieces = line.split("\r") if "\r" in line else (line,)
            last = len(pieces) - 1
            for i, segment in enumerate(pieces):
                if not segment or (i == last and segment.isspace()):
                    continue
                tried = False
                if "heckpoint" in segment:  # a checkpoint line is never a user metric
                    found = len(out)
                    self._segment(segment, order, state, out)
                    if len(out) > found:
                        continue
                    tried = True
                m = search_user(segment)
                if m is not None:
                    rec = self._user_record(m)
                    if rec is not None:
                        out.append(rec)
                        continue
                if tried:
                    continue
                low = segment.lower()
                if segment.isspace() or any(kw in low for kw in _KEYWORDS):
                    self._segment(segment, order, state, out)

    @staticmethod
    def _segment(seg, formats, state, out):
        order = formats.order
        found = len(out)
        for i, family in enumerate(order):
            if family.segment(seg, state, out):
                if i:
                    # this file's trainer: try it first from now on
                    order.insert(0, order.pop(i))
                formats.settled = family.name
                formats.stray(family.name, out, found)
                return

    def _user_record(self, m):
        rec = {"k": "metric", "step": None}
        metric = False
        for field in self._user_fields:
            value = m.group(field)
            if value is None:
                continue
            converted = convert(field, value.strip())
            rec[field] = converted
            if converted is not None:
                metric = True
        return rec if metric else None


class _FileFormats:
    """The families one file tries, in order, the one it settled on, and how many records
    each has read of it."""

    __slots__ = ("order", "settled", "counts")

    def __init__(self, families):
        self.order = list(families)
        self.settled = None
        self.counts = {}  # family name -> metric records it read from this file

    def stray(self, name, out, found):
        """Count the metric records family ``name`` just added (``out[found:]``), and drop
        those with a non-finite loss unless ``name`` is the family that has read the most
        of this file (its trainer's): ``loss=nan`` in a generated sample or a dataset row
        that another family reads is printed text, not a diverged run (``--on-nan stop``;
        agent/rules/judge.py ``nan_loss`` is the rest of the rule)."""
        added = [rec for rec in out[found:] if rec.get("k") == "metric"]
        if not added:
            return
        lead = max(self.counts.values(), default=0)
        mine = self.counts.get(name, 0)
        self.counts[name] = mine + len(added)
        if mine >= lead:
            return
        out[found:] = [rec for rec in out[found:] if not (
            rec.get("k") == "metric" and isinstance(rec.get("loss"), float)
            and not math.isfinite(rec["loss"]))]


NUMBER_MAX = 1e300  # and any other number that is not finite or past this; a loss may be inf/nan


def within_bounds(rec):
    """Drop from a parsed record the values the console would refuse: a step of 10**20 printed
    by a script must not cost the node its connection (it would be refused again at every
    reconnect). A non-finite loss is kept: it is how a run diverging is seen."""
    for key, value in list(rec.items()):
        if key == "k" or isinstance(value, str) or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, int):
            ok = 0 <= value < INT_MAX
        elif key == "loss":
            ok = True
        else:
            ok = -NUMBER_MAX <= value <= NUMBER_MAX  # NaN fails both
        if not ok:
            del rec[key]
    return rec


def _no_match(_text):
    return None


def _is_key_char(ch):
    return ch.isalnum() or ch in "_/."
