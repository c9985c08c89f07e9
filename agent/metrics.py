"""Metric and checkpoint events parsed out of a rank's log text.

The run supervisor feeds every chunk it reads from a rank's log to ``MetricParser.parse``.
Chunks arrive at up to ~100k lines/s per node, so the common case (no metrics at all) costs
a lower-cased copy and three substring scans of the chunk, and only lines that mention a
metric keyword reach Python. Every pattern here is written to stay linear on hostile input
(long digit or blank runs): a log line must never stall the supervisor.

Recognised, in order of precedence on a line:

* checkpoints: the reference trainer's ``checkpoint saved step=50 path=/x/step_00000050.pt
  bytes=123456`` and Hugging Face's ``Saving model checkpoint to /x/checkpoint-500``;
* a user regex, when given (named groups ``step``, ``loss``, ``lr``, ``step_time``, ``tok_s``);
* Hugging Face Trainer dict lines, ``{'loss': 2.34, 'learning_rate': 4.9e-05, ...}``;
* ``key=value`` pairs (``step=12 loss=4.1234 lr=3.000e-04 step_time=0.0163 tok/s=12345``),
  in any order and after any prefix, plus ``key: value`` pairs on a line that has a step.

Standard library only; runs on Python >= 3.8.
"""

import re

__all__ = ["MetricParser", "MAX_LINE", "METRIC_FIELDS"]

#: Lines longer than this are skipped: no trainer prints a metric line this long.
MAX_LINE = 64 * 1024

#: Named groups a user regex may use.
METRIC_FIELDS = ("step", "loss", "lr", "step_time", "tok_s")

# ASCII-only digits: ``\d`` would accept other scripts' digits, which int() also accepts.
# ``[0-9]+(?:\.[0-9]*)?`` rather than ``[0-9]+\.?[0-9]*``: the latter can split a digit run
# in n ways and backtracks quadratically when what follows does not match.
_NUM = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?|(?i:nan|inf(?:inity)?))"

# A line is worth a look only if it mentions one of these (case-insensitively). Plain
# substring tests and a literal alternation keep the regex engine on its fast paths; an
# IGNORECASE alternation scans ~10x slower.
_KEYWORDS = ("step", "loss", "checkpoint")
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_TRIGGERS = {}

# The reference trainer's line, fields in its order: the common case gets one regex match.
_REFERENCE = re.compile(
    r"step=([0-9]{1,18}) loss=(" + _NUM + r") lr=(" + _NUM + r") step_time=(" + _NUM
    + r") tok/s=(" + _NUM + r")[ \t\r]*$",
    re.ASCII,
)

# ``(?<![\w/.])`` keeps ``train_loss``, ``eval/loss``, ``x.lr`` and ``max_step`` out.
_KV = re.compile(
    r"(?<![\w/.])(step_time|global_step|step|loss|learning_rate|lr|tok/s|tok_s|tokens/s)\s*([=:])\s*(" + _NUM + ")",
    re.IGNORECASE | re.ASCII,
)
_KV_FIELD = {
    "step_time": "step_time",
    "global_step": "step",
    "step": "step",
    "loss": "loss",
    "learning_rate": "lr",
    "lr": "lr",
    "tok/s": "tok_s",
    "tok_s": "tok_s",
    "tokens/s": "tok_s",
}

# Hugging Face logs a Python dict repr; newer versions may quote the numbers, and values can
# be wrapped (``tensor(1.2)``, ``np.float64(1.2)``). The quote before the key keeps
# ``'train_loss'`` (the final average) and ``'eval_loss'`` out.
_DICT_KV = re.compile(
    r"""['"](loss|learning_rate|step)['"]\s*:\s*['"]?(?:[A-Za-z_][\w.]*\()?(""" + _NUM + ")",
    re.ASCII,
)
_DICT_FIELD = {"loss": "loss", "learning_rate": "lr", "step": "step"}

_CKPT_REF = re.compile(r"checkpoint saved\b", re.IGNORECASE)
_CKPT_STEP = re.compile(r"(?<![\w/.])step\s*=\s*([0-9]+)", re.ASCII)
_CKPT_BYTES = re.compile(r"(?<![\w/.])bytes\s*=\s*([0-9]+)", re.ASCII)
_CKPT_PATH = re.compile(r"""(?<![\w/.])path\s*=\s*(?:"([^"]*)"|'([^']*)')?""")
# A bare path may hold spaces; it ends before the next `` key=`` or at the end of the line.
_NEXT_KEY = re.compile(r"\s\w+=")
_CKPT_HF = re.compile(r"Saving (?:model )?checkpoint to\s+(.+)")
_TRAILING_INT = re.compile(r"([0-9]+)[\\/]*$", re.ASCII)
_SUFFIXED_INT = re.compile(r"([0-9]+)\.[A-Za-z]+$", re.ASCII)


def _to_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _to_int(text):
    """int of an integer-looking value (``12``, ``12.0``); None for nan, inf or junk."""
    if text is None or len(text) > 30:
        # Python >= 3.11 refuses to convert very long digit strings (int_max_str_digits).
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        return None


def _convert(field, text):
    return _to_int(text) if field == "step" else _to_float(text)


def _compile_user_regex(user_regex):
    if isinstance(user_regex, type(_KV)):
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

    ``user_regex``: a pattern with named groups among step, loss, lr, step_time, tok_s (others
    are ignored), searched on every line. Raises ValueError if it does not compile or names
    none of those groups.
    """

    def __init__(self, user_regex=None):
        self._user = None
        self._user_fields = ()
        if user_regex is not None and user_regex != "":
            self._user, self._user_fields = _compile_user_regex(user_regex)

    def parse(self, text):
        """Records found in ``text``, in order of appearance.

        ``{"k": "metric", "step": int|None, "loss"|"lr"|"step_time"|"tok_s": float, ...}``
        (only the fields found) and ``{"k": "ckpt", "step": int, "path": str, "bytes": int|None}``.
        Never raises on junk: lone surrogates, binary, NaN, huge lines (skipped).
        """
        out = []
        if not text:
            return out
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "surrogateescape")
        elif not isinstance(text, str):
            return out
        if self._user is None:
            self._parse_lines_with_trigger(text, out)
        else:
            self._parse_every_line(text, out)
        return out

    # -- line selection -------------------------------------------------------------------

    def _parse_lines_with_trigger(self, text, out):
        # Lines without a keyword are skipped by C-level substring scans and one regex
        # search per interesting line, never by a Python loop over lines.
        low = text.lower()
        if len(low) != len(text):
            # A few non-ASCII characters lower-case to two (U+0130); offsets would drift.
            low = text.translate(_ASCII_LOWER)
        present = tuple(kw for kw in _KEYWORDS if kw in low)
        if not present:
            return
        trigger = _TRIGGERS.get(present)
        if trigger is None:
            trigger = _TRIGGERS[present] = re.compile("|".join(present))
        search = trigger.search
        reference = _REFERENCE.match
        find = low.find
        rfind = low.rfind
        line_segments = self._line
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
                step, loss, lr, step_time, tok_s = ref.groups()
                out.append({"k": "metric", "step": int(step), "loss": float(loss),
                            "lr": float(lr), "step_time": float(step_time),
                            "tok_s": float(tok_s)})
                continue
            line_segments(text[start:end], out)

    def _parse_every_line(self, text, out):
        search_user = self._user.search
        for line in text.split("\n"):
            if not line or len(line) > MAX_LINE:
                continue
            for segment in line.split("\r") if "\r" in line else (line,):
                if not segment:
                    continue
                if "heckpoint" in segment and self._checkpoint(segment, out):
                    continue
                m = search_user(segment)
                if m is not None:
                    rec = self._user_record(m)
                    if rec is not None:
                        out.append(rec)
                        continue
                low = segment.lower()
                if "step" in low or "loss" in low:
                    self._segment(segment, out)

    def _line(self, line, out):
        # tqdm redraws with a bare \r, so one "line" of a log file can hold several outputs.
        if "\r" in line:
            for segment in line.split("\r"):
                if segment:
                    self._segment(segment, out)
        else:
            self._segment(line, out)

    # -- formats --------------------------------------------------------------------------

    def _segment(self, seg, out):
        if "heckpoint" in seg and self._checkpoint(seg, out):
            return
        if "loss'" in seg or 'loss"' in seg:
            rec = self._dict_record(seg)
            if rec is not None:
                out.append(rec)
                return
        pairs = _KV.findall(seg)
        if not pairs:
            return
        found = {}
        for key, sep, value in pairs:
            field = _KV_FIELD.get(key.lower())
            if field is not None and field not in found:
                found[field] = (sep, value)
        has_step = "step" in found
        rec = {"k": "metric", "step": None}
        metric = False
        for field, (sep, value) in found.items():
            # ``key: value`` is common prose ("lr: see above"); trust it only on a step line.
            if sep == ":" and not has_step:
                continue
            rec[field] = _convert(field, value)
            if field != "step":
                metric = True
        if metric:
            out.append(rec)

    @staticmethod
    def _dict_record(seg):
        if "{" not in seg:
            return None
        rec = None
        for key, value in _DICT_KV.findall(seg):
            field = _DICT_FIELD[key]
            if rec is None:
                rec = {"k": "metric", "step": None}
            if field not in rec or rec[field] is None:
                rec[field] = _convert(field, value)
        # Only a training-loss line is a metric; ``{'train_runtime': .., 'train_loss': ..}``
        # never matched ``'loss'`` above, and a bare learning-rate dict is not a step.
        if rec is None or "loss" not in rec:
            return None
        return rec

    @staticmethod
    def _checkpoint(seg, out):
        if _CKPT_REF.search(seg) is not None:
            pm = _CKPT_PATH.search(seg)
            if pm is None:
                return False
            path = pm.group(1) if pm.group(1) is not None else pm.group(2)
            if path is None:
                nm = _NEXT_KEY.search(seg, pm.end())
                path = seg[pm.end():nm.start() if nm is not None else len(seg)].rstrip()
            if not path:
                return False
            sm = _CKPT_STEP.search(seg)
            step = _to_int(sm.group(1)) if sm is not None else _step_from_path(path)
            if step is None:
                return False
            bm = _CKPT_BYTES.search(seg)
            out.append({"k": "ckpt", "step": step, "path": path,
                        "bytes": _to_int(bm.group(1)) if bm is not None else None})
            return True
        hm = _CKPT_HF.search(seg)
        if hm is not None:
            path = hm.group(1).rstrip()
            step = _step_from_path(path)
            if step is None:
                return False
            out.append({"k": "ckpt", "step": step, "path": path, "bytes": None})
            return True
        return False

    def _user_record(self, m):
        rec = {"k": "metric", "step": None}
        metric = False
        for field in self._user_fields:
            value = m.group(field)
            if value is None:
                continue
            converted = _convert(field, value.strip())
            rec[field] = converted
            if converted is not None:
                metric = True
        return rec if metric else None


def _is_key_char(ch):
    return ch.isalnum() or ch in "_/."


def _step_from_path(path):
    # Only the tail: a search for a trailing digit run is quadratic in a long digit run.
    tail = path[-64:]
    m = _TRAILING_INT.search(tail)
    if m is None:
        # e.g. step_00000050.pt: the number sits before the suffix.
        m = _SUFFIXED_INT.search(tail)
    return _to_int(m.group(1)) if m is not None else None
