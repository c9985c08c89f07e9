"""Log output is untrusted: make a line safe to show in a terminal or a Textual widget.

ANSI escape sequences are removed, other control characters shown as U+FFFD (tabs become
spaces), bytes that were not UTF-8 (surrogate escapes) as U+FFFD, secrets masked, and the
line capped. The result is plain text: callers must still never parse it as markup.

Secrets are masked by one :class:`Masker` per run: RunState masks every line as it is cut
from a node's data (console/lines/lines.py, with a carried tail for lines cut in pieces), every
event text and every node cause; :func:`clean` masks again on the way to the screen, seeing
through the escape sequences and control characters it removes, so a secret they interrupt
is caught too. The host masks by the same rules (agent/rules/mask.py: what a secret's masked forms
are, and the short-secret threshold, are defined there once). docs/SECURITY.md says what
this does and does not promise.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from agent.rules.mask import SHORT as SHORT_SECRET, alternation, mask_through, secret_forms, \
    several_lines
from .lines import Entry

MAX_LINE = 4096
MASK = "****"
# CSI; OSC and the DCS, SOS, PM and APC strings to their end (their payload is no text
# either); other two-character escapes. 7-bit and C1 forms (U+009B is a CSI to a terminal).
_ANSI = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
                   r"|(?:\x1b[]PX^_]|[\x9d\x90\x98\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                   r"|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_HIDDEN = re.compile(_ANSI.pattern + "|" + _CONTROL.pattern)  # what clean() does not show


class Masker:
    """Replaces a run's secret values with ``****``, longest first, in one pass.

    One compiled alternation of every secret, longest first: where two secrets start at the
    same place the longer one is masked whole (``abc`` cannot leave ``****def123`` of
    ``abcdef123``). A secret is masked without the white space around it, and a multi-line
    one line by line too (agent/rules/mask.py ``secret_forms``). Each is also matched in the form
    :func:`clean` gives it (control characters as U+FFFD), so a secret with a control
    character is masked before and after cleaning. A secret shorter than SHORT_SECRET
    characters is masked only where it stands as a whole word: masking every ``ab`` inside
    other words would both mangle the log and reveal the secret by where the stars fall (see
    :func:`secret_warnings`).
    """

    def __init__(self, secrets=()):
        raw = secret_forms(secrets)
        self.secrets = tuple(sorted(raw))
        self.forms = tuple(sorted(raw | {_CONTROL.sub("\ufffd", s) for s in raw},
                                  key=lambda s: (-len(s), s)))
        self.longest = len(self.forms[0]) if self.forms else 0
        self._pattern = alternation(self.forms)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str, mask: str = MASK) -> str:
        """``text`` with every secret replaced by ``mask`` (``****``)."""
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(mask.replace("\\", "\\\\"), text)

    def mask_hidden(self, text: str) -> str:
        """:meth:`mask`, also where escape sequences or control characters stand inside a
        secret (what :func:`clean` removes or shows as U+FFFD): the secret is masked with
        them."""
        if self._pattern is None or not text:
            return text
        return mask_through(self._pattern, _HIDDEN, text, MASK)

    def safe_cut(self, text: str) -> int:
        """Where the unended line ``text`` may be cut so that no secret is split by the cut.

        What is before the cut can be masked and shown now; what follows (less than the
        longest secret, or a whole secret that reaches past that) must wait for the data
        that follows, so that a secret written across two pieces is seen whole.
        """
        if self._pattern is None:
            return len(text)
        cut = max(0, len(text) - (self.longest - 1))
        while cut > 0:
            starts = [p for p in range(max(0, cut - self.longest + 1), cut)
                      for s in self.forms if p + len(s) > cut and text.startswith(s, p)]
            if not starts:
                return cut
            cut = min(starts)
        return cut


NO_SECRETS = Masker()


@functools.lru_cache(maxsize=16)
def _masker_of(secrets: tuple) -> Masker:
    return Masker(secrets)


def masker_for(secrets) -> Masker:
    """The Masker of ``secrets`` (a Masker is returned as it is); built once per set."""
    if isinstance(secrets, Masker):
        return secrets
    return _masker_of(tuple(secrets or ())) if secrets else NO_SECRETS


def secret_warnings(secrets) -> list[str]:
    """What to warn about ``secrets`` at launch: values shorter than SHORT_SECRET characters,
    values of several lines (each masked only in part somewhere)."""
    warnings, values = [], masker_for(secrets).secrets
    short = [s for s in values if len(s) < SHORT_SECRET]
    if short:
        warnings.append("%d secret value(s) shorter than %d characters: masked only where "
                        "they stand as a whole word, so they may show inside other text; use "
                        "longer secrets" % (len(short), SHORT_SECRET))
    several = [s for s in values if several_lines(s)]  # a whole one is among its forms
    if several:
        warnings.append("%d secret value(s) of several lines: each line of %d characters or "
                        "more is masked on its own, shorter lines are shown; a line may also "
                        "be masked where it is not the secret" % (len(several), SHORT_SECRET))
    return warnings


def clean(line: str, secrets=(), limit: int = MAX_LINE) -> str:
    """``line`` made safe to show. ``secrets``: a Masker, or the secret values to mask."""
    masker = masker_for(secrets)
    if masker:  # before anything is removed: a secret with a control character still matches
        line = masker.mask(line)
    if "\r" in line:  # progress bars redraw with \r: keep what a terminal would show last
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    if masker:  # and through what is removed: a secret split by escapes is masked whole
        line = masker.mask_hidden(line)
    raw = line
    if "\x1b" in line or not line.isascii():  # C1 escapes are not ASCII either
        line = _ANSI.sub("", line)
    line = _CONTROL.sub("\ufffd", line)
    if masker and line != raw:  # and after: a secret with a control character, split by
        line = masker.mask(line)  # escapes, is whole again in its cleaned form
    if "\t" in line:
        line = line.expandtabs(4)
    if len(line) > limit:  # last: nothing after it may lengthen the line again
        extra = len(line) - limit
        line = line[:limit] + " … [+%d chars]" % extra
    return line


def one_line(text: str, limit: int = 300) -> str:
    """A host's short message (a command's stderr, a field of its output) made safe to show
    as one line: its lines joined with `` / ``, then :func:`clean`, its last ``limit``
    characters (the end of an error says most). Plain text: never parse it as markup."""
    joined = " / ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return clean(joined[-4 * limit:], limit=4 * limit)[-limit:]


def clean_tree(value):
    """``value`` (decoded JSON from a host: preflight facts) with every string in it cleaned,
    keys included; numbers and the rest as they are."""
    return _each_string(value, clean, keys=True)


def mask_tree(value, masker: Masker):
    """``value`` (a verdict: dicts, lists, strings) with the run's secrets masked in every
    string but the keys (the verdict's own field names)."""
    return _each_string(value, masker.mask, keys=False)


def _each_string(value, change: Callable[[str], str], keys: bool):
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {(_each_string(k, change, keys) if keys else k): _each_string(v, change, keys)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_each_string(v, change, keys) for v in value]
    return value


def shown_text(secrets=()) -> Callable[[str], str]:
    """:func:`clean` with ``secrets`` masked, as a function of the line alone."""
    masker = masker_for(secrets)
    return lambda line: clean(line, masker)


def cleaned(entries, secrets=()) -> list[Entry]:
    """Log entries with their text made safe to show (:func:`clean`), as a new list."""
    masker = masker_for(secrets)
    return [Entry(ts, node, rank, clean(text, masker), journal, index)
            for ts, node, rank, text, journal, index in entries]
