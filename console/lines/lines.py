"""A log line as the console models it: cut from a file's data, placed by its position.

A followed file's data reaches the console in journal records that need not end at a line
end; :func:`split_lines` cuts them, the same way for live data (console/model/apply.py) and for
pages read back from a node (console/model/scrollback.py), so both give the same lines.

A line's *position* on its node is ``(journal, index)``: where its record starts in the
node's journal and which of the record's lines it is. An :class:`Entry` is one line as the
log views hold it, position included. No asyncio, no Textual.
"""

from __future__ import annotations

from typing import NamedTuple

MAX_PARTIAL = 64 * 1024  # longest line kept whole; longer ones are passed on in pieces
AFTER_RECORD = 1 << 62  # as a position's index: just past every line of that record


class Entry(NamedTuple):
    """One line of a log view: when, where from, its text and its position on its node.

    ``rank`` is -1 for torchrun's own output and None when unknown; ``journal`` is None from
    an agent that gives no positions (then nothing before it can be fetched).
    """

    ts: float | None
    node: str
    rank: int | None
    text: str
    journal: int | None
    index: int

    @property
    def position(self) -> tuple:
        """``(journal, index)``: where the line is on its node."""
        return (self.journal, self.index)


def split_lines(partial: str, text: str, masker=None) -> tuple[list[str], str]:
    """``(lines, rest)``: ``partial`` (the unended end of the data before) plus ``text`` cut
    at line ends; ``rest`` is what follows the last line end.

    No line is longer than MAX_PARTIAL: a longer one comes as pieces, and a ``rest`` longer
    than that is passed on as a line of its own rather than kept waiting for its end.

    ``masker`` (console/lines/sanitize.py ``Masker``): every line is returned with the run's secrets
    masked, found in whole lines before any cut into pieces; a ``rest`` passed on in pieces
    keeps back a tail where a secret may continue (``Masker.safe_cut``), so a secret written
    across two writes or two pieces is seen whole. ``rest`` itself is never masked: it is
    raw data that the next call joins to what follows.
    """
    joined = partial + text if partial else text
    end = joined.rfind("\n")
    rest = joined[end + 1:]
    lines = joined[:end].split("\n") if end >= 0 else []
    if len(rest) > MAX_PARTIAL:  # a line with no end in sight: pass it on in pieces
        cut = masker.safe_cut(rest) if masker else len(rest)
        lines.append(rest[:cut])
        rest = rest[cut:]
    if masker:
        lines = [masker.mask(line) for line in lines]
    if len(joined) > MAX_PARTIAL:  # a finished line can be huge too: cut it in pieces
        lines = [piece for line in lines for piece in _pieces(line)]
    return lines, rest


def _pieces(line: str) -> list[str]:
    if len(line) <= MAX_PARTIAL:
        return [line]
    return [line[i:i + MAX_PARTIAL] for i in range(0, len(line), MAX_PARTIAL)]
