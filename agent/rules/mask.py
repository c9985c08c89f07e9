"""Secret values masked on the host, before a log line enters the run's journal.

The console masks every line as well (console/lines/sanitize.py), but only with the secrets it
knows: a console started in a shell without the run's ``${VAR}`` cannot read them back. So
the supervisor, which holds the run's secret values (from the spec on its stdin), masks data
records before they are written to the journal, and everything served from it (live lines,
scrollback, `logs`, `attach` from any shell) is masked already. Torchrun's own log files on
the host stay as written (the host has the secrets anyway; docs/SECURITY.md).

Same rules as the console, which takes :func:`secret_forms`, :data:`SHORT` and
:func:`mask_through` from here: longest first in one pass; a secret shorter than SHORT
characters only where it stands as a whole word; a multi-line secret line by line too; a
secret with escape sequences or control characters written inside it is still found. The
follower never cuts a record inside a secret (:meth:`Masker.safe_cut`, agent/host/tail.py).
"""

import bisect
import re

MASK = b"****"
SHORT = 8  # shorter secrets are masked only as whole words: see secret_forms

# What a terminal does not show as text: escape sequences (CSI, OSC, and the DCS/SOS/PM/APC
# strings, whose payload is no text either; 7-bit, and C1 as UTF-8) and the other control
# characters but tab and newline. A secret with these written inside it is masked whole
# (mask_through). A C1 byte that is not UTF-8 is left alone: it may be part of a character.
ESCAPES = re.compile(
    rb"(?:\x1b\[|\xc2\x9b)[0-?]*[ -/]*[@-~]"  # CSI
    rb"|(?:\x1b[]PX^_]|\xc2[\x9d\x90\x98\x9e\x9f])"  # OSC, DCS, SOS, PM, APC: to their end
    rb"(?:[^\x07\x1b\n\xc2]|\xc2[^\x9c])*(?:\x07|\x1b\\|\xc2\x9c)?"
    rb"|\x1b[@-Z\\-_]?|\xc2[\x80-\x9f]|[\x00-\x08\x0b-\x1f\x7f]")


def secret_forms(secrets):
    """The texts to mask for ``secrets`` (strings): each value without the white space
    around it (a YAML block scalar's value ends in a newline that no printed line holds) and,
    for a value of several lines (a PEM key, a JSON file), each of its lines of SHORT
    characters or more, which is printed (and journaled) apart from the others. Its shorter
    lines are not masked on their own: ``}`` or ``ab12`` everywhere would mangle the log."""
    forms = set()
    for secret in secrets:
        whole = (secret or "").strip()
        if not whole:
            continue
        forms.add(whole)
        lines = [line.strip() for line in whole.splitlines()]
        if len(lines) > 1:
            forms.update(line for line in lines if len(line) >= SHORT)
    return forms


def several_lines(secret):
    """Whether ``secret`` is masked line by line (docs/SECURITY.md)."""
    return len((secret or "").strip().splitlines()) > 1


def alternation(forms):
    """One compiled pattern of ``forms`` (all str or all bytes, longest first): each form as
    written, one shorter than SHORT only where it stands as a whole word; None for none."""
    if not forms:
        return None
    word, bar = (rb"(?<!\w)%s(?!\w)", b"|") if isinstance(forms[0], bytes) else \
        (r"(?<!\w)%s(?!\w)", "|")
    return re.compile(bar.join(re.escape(f) if len(f) >= SHORT else word % re.escape(f)
                               for f in forms))


def mask_through(pattern, skip, text, mask):
    """``text`` (masked as written already) with every match of ``pattern`` that stretches
    matched by ``skip`` (escape sequences, control characters) interrupt replaced by
    ``mask``: from its first character to its last, the skipped ones included."""
    bare = skip.sub(text[:0], text)
    if len(bare) == len(text) or not pattern.search(bare):
        return text  # the common case, at the regex engine's speed
    starts, bare_starts, pos, size = [], [], 0, 0
    for m in skip.finditer(text):  # where each stretch that bare keeps starts, in both
        if m.start() > pos:
            starts.append(pos)
            bare_starts.append(size)
            size += m.start() - pos
        pos = m.end()
    starts.append(pos)
    bare_starts.append(size)
    found = [m.span() for m in pattern.finditer(bare)]

    def at(i):  # where the i-th kept character is in text
        k = bisect.bisect_right(bare_starts, i) - 1
        return starts[k] + i - bare_starts[k]

    out, pos = [], 0
    for a, b in found:
        a, b = at(a), at(b - 1) + 1
        out += [text[pos:a], mask]
        pos = b
    out.append(text[pos:])
    return text[:0].join(out)


class Masker:
    """Replaces a run's secret values (strings) with ``****`` in bytes of log data."""

    def __init__(self, secrets=()):
        self.forms = sorted((f.encode("utf-8", "surrogateescape")
                             for f in secret_forms(secrets)), key=lambda b: (-len(b), b))
        self.longest = len(self.forms[0]) if self.forms else 0
        self.pattern = alternation(self.forms)

    def mask(self, data):
        """``data`` (bytes) with every secret replaced by ``****``."""
        if self.pattern is None or not data:
            return data
        return mask_through(self.pattern, ESCAPES, self.pattern.sub(MASK, data), MASK)

    def mask_text(self, text):
        if self.pattern is None or not text:
            return text
        return self.mask(text.encode("utf-8", "surrogateescape")).decode(
            "utf-8", "surrogateescape")

    def mask_tree(self, obj):
        """``obj`` (JSON-like data: a verdict, a stack report) with every string masked."""
        if isinstance(obj, str):
            return self.mask_text(obj)
        if isinstance(obj, dict):
            return {k: self.mask_tree(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.mask_tree(v) for v in obj]
        return obj

    def safe_cut(self, data, end):
        """The last place at or before ``end`` where ``data`` may be cut without cutting a
        secret: one seen whole across ``end``, or begun before it and going on to the end of
        ``data`` (the rest may follow in the next read). ``end`` when none is."""
        while end > 0:
            starts = [p for p in range(max(0, end - self.longest + 1), end)
                      for f in self.forms
                      if p + len(f) > end and f.startswith(data[p:p + len(f)])]
            if not starts:
                return end
            end = min(starts)
        return end
