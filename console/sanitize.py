"""Log output is untrusted: make a line safe to show in a terminal or a Textual widget.

ANSI escape sequences are removed, other control characters shown as U+FFFD (tabs become
spaces), bytes that were not UTF-8 (surrogate escapes) as U+FFFD, secrets masked, and the
line capped. The result is plain text: callers must still never parse it as markup.
"""

from __future__ import annotations

import re

MAX_LINE = 4096
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def clean(line: str, secrets: tuple[str, ...] | list[str] = (), limit: int = MAX_LINE) -> str:
    if "\r" in line:  # progress bars redraw with \r: keep what a terminal would show last
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    line = _CONTROL.sub("\ufffd", line)
    for s in secrets:  # before the cap: a secret cut in two would not be found
        if s and s in line:
            line = line.replace(s, "****")
    if "\t" in line:
        line = line.expandtabs(4)
    if len(line) > limit:  # last: nothing after it may lengthen the line again
        extra = len(line) - limit
        line = line[:limit] + " … [+%d chars]" % extra
    return line
