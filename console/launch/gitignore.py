"""The common subset of gitignore patterns, for trees that are not git work trees.

Supported (git's own rules, `gitignore(5)`): blank lines and ``#`` comments; ``\\#`` and ``\\!``
for a literal first character; trailing spaces dropped unless escaped; ``!`` negation (the last
matching pattern wins; a file inside an excluded folder cannot be re-included, because the
folder is never entered); a trailing ``/`` matches folders only; a ``/`` at the start or in the
middle anchors the pattern to the .gitignore's folder, otherwise it matches a name at any depth;
``*``, ``?``, ``[abc]``, ``[a-z]``, ``[!a]`` never match ``/``; ``**/`` (any folders, none
included), ``/**`` (everything inside) and ``/**/``; a .gitignore in a subfolder applies below
it, after the ones above.

Not supported: ``.git/info/exclude`` and ``core.excludesFile`` (no git here), case-insensitive
matching (``core.ignoreCase``), POSIX classes such as ``[[:digit:]]``. A pattern this module
cannot read (an unclosed ``[``) matches nothing, like git.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Pattern:
    """One line of a .gitignore; ``base`` is its folder relative to the tree ("" at the top)."""

    base: str
    regex: re.Pattern
    negate: bool
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1:]
        subject = rel if self.anchored else rel.rsplit("/", 1)[-1]
        return self.regex.fullmatch(subject) is not None


def _translate(pat: str) -> str:
    """A gitignore glob as a regular expression over a ``/``-separated path."""
    out, i, n = [], 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*":
            if pat.startswith("**", i) and (i == 0 or pat[i - 1] == "/"):
                if i + 2 == n:
                    out.append(".*")  # `x/**`: everything inside; `**`: everything
                    i += 2
                    continue
                if pat[i + 2] == "/":
                    out.append("(?:.*/)?")  # `**/`: zero or more folders
                    i += 3
                    continue
            while i < n and pat[i] == "*":  # any other run of stars is one `*`
                i += 1
            out.append("[^/]*")
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < n and pat[j] in "!^":
                j += 1
            if j < n and pat[j] == "]":
                j += 1
            while j < n and pat[j] != "]":
                j += 1
            if j >= n:
                return r"(?!)"  # unclosed class: git matches nothing
            body = pat[i + 1:j]
            neg = body[:1] in ("!", "^")
            if neg:
                body = body[1:]
            body = body.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
            out.append("[^/%s]" % body if neg else "(?!/)[%s]" % body)
            i = j
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pat[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_line(line: str, base: str = "") -> Pattern | None:
    """One .gitignore line as a Pattern, or None for blanks and comments."""
    line = line.rstrip("\n").rstrip("\r")
    if not line or line.startswith("#"):
        return None
    # trailing spaces go unless escaped with a backslash
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    try:
        regex = re.compile(_translate(line), re.DOTALL)
    except re.error:
        return None
    return Pattern(base, regex, negate, dir_only, anchored)


def parse(text: str, base: str = "") -> list[Pattern]:
    return [p for p in (parse_line(line, base) for line in text.splitlines()) if p is not None]


def ignored(patterns: list[Pattern], rel: str, is_dir: bool) -> bool:
    """Is ``rel`` (relative to the tree, ``/``-separated) ignored? The last match decides."""
    result = False
    for pat in patterns:
        if pat.matches(rel, is_dir):
            result = not pat.negate
    return result
