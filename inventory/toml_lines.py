"""TOML to plain data, with a best-effort guess of where each key is, for ``file:line`` errors.

``tomllib`` reports a line for syntax errors but keeps no positions in the data it returns.
So after a successful parse this module scans the text once: it follows table headers
(``[defaults]``, ``[[hosts]]``, counting array-of-tables entries so ``[hosts.env]`` belongs to
the latest host), ``key = value`` lines (dotted keys included) and one-line inline tables
(``TOKEN = { value = "x", secret = true }``). An error whose key is not found this way falls
back to the line of the nearest enclosing table, or to no line. Not followed: arrays of inline
tables (``hosts = [{...}]``) and keys inside multi-line values.
"""

from __future__ import annotations

import re
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .model import InventoryError, too_long_number

_BARE = r"[A-Za-z0-9_-]+"
_KEY = rf"""(?:{_BARE}|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_KEY_PART = re.compile(_KEY)
_HEADER = re.compile(rf"\s*(\[\[?)\s*({_DOTTED})\s*\]")
_KEYVAL = re.compile(rf"\s*({_DOTTED})\s*=")
# Inside a value: a key of an inline table, a string to skip, a brace, or a comment.
_TOKEN = re.compile(rf"""({_DOTTED})\s*=|"(?:[^"\\]|\\.)*"|'[^']*'|[{{}}]|#""")
_LONG_NUMBER = re.compile(r"[0-9][0-9_]{4000,}")
_AT = re.compile(r"\s*\((?:at line (\d+), column (\d+)|at end of document)\)\s*$")

_HINTS = (
    ("Invalid value", 'text needs quotes in TOML: key = "value"'),
    ("Cannot overwrite", "a key is set twice; remove one of them"),
    ("Cannot declare", "a table is declared twice; merge the two [sections]"),
    ("Expected '=' after a key", "write key = value"),
    ("Unterminated string", "close the quote"),
)


def _split(dotted: str) -> tuple:
    return tuple(part.strip("\"'") for part in _KEY_PART.findall(dotted))


def _table_path(names: tuple, counts: dict, array: bool) -> tuple:
    """``hosts.env`` after the third ``[[hosts]]`` is ("hosts", 2, "env")."""
    path: list = []
    for depth, name in enumerate(names):
        path.append(name)
        key = names[: depth + 1]
        if array and depth == len(names) - 1:
            counts[key] = counts.get(key, 0) + 1
        if key in counts:
            path.append(counts[key] - 1)
    return tuple(path)


def _inline_keys(rest: str, path: tuple, number: int, found: dict) -> None:
    stack, last = [path], path
    for match in _TOKEN.finditer(rest):
        token = match.group(0)
        if match.group(1) and len(stack) > 1:
            last = stack[-1] + _split(match.group(1))
            found.setdefault(last, number)
        elif token == "{":
            stack.append(last)
        elif token == "}" and len(stack) > 1:
            stack.pop()
        elif token == "#":
            break


def key_lines(text: str) -> dict:
    """Map each key path found in ``text`` (e.g. ("hosts", 1, "slots")) to its 1-based line."""
    found: dict = {}
    table: tuple = ()
    counts: dict = {}
    open_quote = None
    for number, line in enumerate(text.splitlines(), 1):
        if open_quote:  # inside a multi-line string
            if line.count(open_quote) % 2:
                open_quote = None
            continue
        header = _HEADER.match(line)
        if header:
            array = header.group(1) == "[["
            table = _table_path(_split(header.group(2)), counts, array)
            found.setdefault(table, number)
            if array:
                found.setdefault(table[:-1], number)
            continue
        keyval = _KEYVAL.match(line)
        if not keyval:
            continue
        path = table + _split(keyval.group(1))
        found.setdefault(path, number)
        rest = line[keyval.end():]
        _inline_keys(rest, path, number, found)
        open_quote = next((q for q in ('"""', "'''") if rest.count(q) % 2), None)
    return found


class TomlDoc:
    """Loaded TOML data and a best-effort map of where its keys are."""

    def __init__(self, data: Any, text: str):
        self.data = data
        self._lines = key_lines(text)

    def line(self, path: tuple) -> int | None:
        """The line of ``path``, else of its nearest enclosing key or table found, else None."""
        for end in range(len(path), 0, -1):
            if path[:end] in self._lines:
                return self._lines[path[:end]]
        return None

    def raw(self, path: tuple) -> str | None:
        return None  # tomllib keeps no source text


def parse(path: str, text: str) -> TomlDoc:
    """Parse ``text`` (the contents of ``path``); raise InventoryError on a syntax error."""
    try:
        return TomlDoc(tomllib.loads(text), text)
    except tomllib.TOMLDecodeError as err:
        message = str(err).splitlines()[0] if str(err) else "not valid TOML"
        at = _AT.search(message)
        line = None
        if at:
            message = message[: at.start()]
            line = int(at.group(1)) if at.group(1) else len(text.splitlines()) or 1
            if at.group(2):
                message += f" at column {at.group(2)}"
        hint = next((h for key, h in _HINTS if message.startswith(key)),
                    "check the quoting, '=' and brackets on this line")
        message = message[:1].lower() + message[1:]
        raise InventoryError(path, line, f"TOML syntax error: {message}; {hint}") from None
    except ValueError:  # a number of more digits than Python converts (past 4300)
        long = _LONG_NUMBER.search(text)
        raise InventoryError(path, text.count("\n", 0, long.start()) + 1 if long else None,
                             too_long_number(len(long.group()) if long else 0)) from None
