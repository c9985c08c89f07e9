"""SVG screenshots read as the terminal does: no word starts its <text> with spaces that a
renderer may drop (librsvg drew ``runningelapsed`` in the README's screenshot)."""

from __future__ import annotations

import html
import re

from rich.console import Console
from rich.text import Text

from console.tui.screenshot import whole_spaces

TEXTS = re.compile(r'<text [^>]*?x="([\d.]+)"[^>]*?textLength="([\d.]+)"[^>]*>([^<]*)</text>')


def exported(text: Text, width: int = 60) -> str:
    console = Console(width=width, record=True, force_terminal=True, color_system="truecolor",
                      file=open("/dev/null", "w"))
    console.print(text)
    return console.export_svg(title="t")


def drawn(svg: str) -> str:
    """The line as a renderer that drops each <text>'s leading and trailing white space
    draws it: each text at its column (12.2 px a cell in Rich's export)."""
    cells = [" "] * 80
    for x, _length, body in TEXTS.findall(svg):
        word = html.unescape(body).strip("\xa0 ")
        col = round(float(x) / 12.2)
        lead = len(html.unescape(body)) - len(html.unescape(body).lstrip("\xa0 "))
        cells[col + lead: col + lead + len(word)] = word
    return "".join(cells).replace("\xa0", " ").rstrip()


def header_line() -> Text:
    text = Text()
    text.append("● running", "green")
    text.append("  elapsed 0:01:17  step 62/2000", "")
    text.append("  ", "")
    text.append("nodes 4/4 up", "bold")
    return text


def test_rich_export_starts_texts_with_spaces_that_renderers_drop():
    """The cause, as Rich writes it: a run of one style starts with its separating spaces."""
    svg = exported(header_line())
    assert any(html.unescape(body).startswith("\xa0") for _x, _l, body in TEXTS.findall(svg))


def test_every_word_is_drawn_at_its_own_column():
    svg = whole_spaces(exported(header_line()))
    for x, length, body in TEXTS.findall(svg):
        plain = html.unescape(body)
        assert plain == plain.strip("\xa0")  # nothing left for a renderer to drop
        assert abs(float(length) - 12.2 * len(plain)) < 0.05  # stretched over its own cells
    # a renderer that drops leading spaces now draws what the terminal shows
    assert drawn(svg) == "● running  elapsed 0:01:17  step 62/2000  nodes 4/4 up"
