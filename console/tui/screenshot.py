"""SVG screenshots that read as the terminal does.

Rich's SVG export (which Textual's ``export_screenshot`` uses) writes a run of cells of one
style as one ``<text>`` at its column, stretched to its width with ``textLength``, and a
space as ``&#160;``. A run that starts with spaces (``"  elapsed 0:01:17"`` after
``"● running"``) is drawn by renderers that drop leading white space (librsvg, so every
tool built on it) from its column on: ``runningelapsed``, the rest stretched over the gap.
``whole_spaces`` moves each run's leading spaces into its ``x`` and drops its trailing ones,
so each word is drawn at its own column whatever the renderer does with white space.
"""

from __future__ import annotations

import html
import re

SPACE = "&#160;"
TEXT = re.compile(r'(<text [^>]*?)x="([\d.]+)"([^>]*?)textLength="([\d.]+)"([^>]*>)([^<]*)'
                  r'(</text>)')


def _moved(match: re.Match) -> str:
    head, x, middle, length, tail, body, close = match.groups()
    chars = len(html.unescape(body))
    stripped, lead = body, 0
    while stripped.startswith(SPACE):
        stripped, lead = stripped[len(SPACE):], lead + 1
    trail = 0
    while stripped.endswith(SPACE):
        stripped, trail = stripped[: -len(SPACE)], trail + 1
    if not (lead or trail) or not chars:
        return match.group(0)
    if not stripped:
        return ""
    cell = float(length) / chars
    return '%sx="%s"%stextLength="%s"%s%s%s' % (
        head, _num(float(x) + lead * cell), middle, _num(float(length) - (lead + trail) * cell),
        tail, stripped, close)


def _num(value: float) -> str:
    return ("%.2f" % value).rstrip("0").rstrip(".")


def whole_spaces(svg: str) -> str:
    """``svg`` (Rich's export) with no ``<text>`` starting or ending in spaces."""
    return TEXT.sub(_moved, svg)
