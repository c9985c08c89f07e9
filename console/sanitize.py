"""Log output is untrusted: make a line safe to show in a terminal or a Textual widget.

ANSI escape sequences are removed, other control characters shown as U+FFFD (tabs become
spaces), bytes that were not UTF-8 (surrogate escapes) as U+FFFD, secrets masked, and the
line capped. The result is plain text: callers must still never parse it as markup.

Secrets are masked by one :class:`Masker` per run: RunState masks every line as it is cut
from a node's data (console/lines.py, with a carried tail for lines cut in pieces), every
event text and every node cause; :func:`clean` masks again on the way to the screen, so a
secret hidden by escape sequences or control characters is caught too. docs/SECURITY.md
says what this does and does not promise.
"""

from __future__ import annotations

import functools
import re
from typing import Callable

from .lines import Entry

MAX_LINE = 4096
MASK = "****"
SHORT_SECRET = 8  # shorter secrets are masked only as whole words (see Masker)
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


class Masker:
    """Replaces a run's secret values with ``****``, longest first, in one pass.

    One compiled alternation of every secret, longest first: where two secrets start at the
    same place the longer one is masked whole (``abc`` cannot leave ``****def123`` of
    ``abcdef123``). Each secret is also matched in the form :func:`clean` gives it (control
    characters as U+FFFD), so a secret with a control character is masked before and after
    cleaning. A secret shorter than SHORT_SECRET characters is masked only where it stands as
    a whole word: masking every ``ab`` inside other words would both mangle the log and
    reveal the secret by where the stars fall (see :func:`short_secret_warning`).
    """

    def __init__(self, secrets=()):
        raw = {s for s in secrets if s}
        self.secrets = tuple(sorted(raw))
        self.forms = tuple(sorted(raw | {_CONTROL.sub("\ufffd", s) for s in raw},
                                  key=lambda s: (-len(s), s)))
        self.longest = len(self.forms[0]) if self.forms else 0
        alternatives = [re.escape(s) if len(s) >= SHORT_SECRET
                        else r"(?<!\w)%s(?!\w)" % re.escape(s) for s in self.forms]
        self._pattern = re.compile("|".join(alternatives)) if alternatives else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str) -> str:
        """``text`` with every secret replaced by ``****``."""
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MASK, text)

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


def short_secret_warning(secrets) -> str | None:
    """The warning for secrets shorter than SHORT_SECRET characters, or None when none is."""
    short = [s for s in masker_for(secrets).secrets if len(s) < SHORT_SECRET]
    if not short:
        return None
    return ("%d secret value(s) shorter than %d characters: masked only where they stand as "
            "a whole word, so they may show inside other text; use longer secrets"
            % (len(short), SHORT_SECRET))


def clean(line: str, secrets=(), limit: int = MAX_LINE) -> str:
    """``line`` made safe to show. ``secrets``: a Masker, or the secret values to mask."""
    masker = masker_for(secrets)
    if masker:  # before anything is removed: a secret with a control character still matches
        line = masker.mask(line)
    raw = line
    if "\r" in line:  # progress bars redraw with \r: keep what a terminal would show last
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = _CONTROL.sub("\ufffd", line)
    if masker and line != raw:  # and after: one split by escapes is whole again now
        line = masker.mask(line)
    if "\t" in line:
        line = line.expandtabs(4)
    if len(line) > limit:  # last: nothing after it may lengthen the line again
        extra = len(line) - limit
        line = line[:limit] + " … [+%d chars]" % extra
    return line


def clean_tree(value):
    """``value`` (decoded JSON from a host: preflight facts) with every string in it cleaned,
    keys included; numbers and the rest as they are."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean_tree(k): clean_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_tree(v) for v in value]
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
