"""The private Textual names console/tui/ relies on: all listed, all still there.

console/tui/internals.py lists them. An upgrade of Textual that drops or renames any fails
here once, with the whole list; a file in console/tui/ that starts using a private name of
Textual's without listing it fails here too. What counts as such a use, read from the source:
``obj._name`` on anything but ``self`` (``super()._on_focus`` included); ``self._name`` in a
class where rankdeck did not define ``_name``; and a private name a rankdeck class defines
(a method, a class attribute or ``self._name = ...``) that its Textual base already has,
which overrides or hides Textual's own.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import textual

from console.tui.internals import TEXTUAL_INTERNALS

TUI = Path(__file__).resolve().parents[2] / "console" / "tui"
PRIVATE = re.compile(r"^_(?!_)")  # _name, not __dunder__
LISTED = {(internal.name, internal.used_in) for internal in TEXTUAL_INTERNALS}


def fresh(owner: type):
    """An instance of the Textual class ``owner``, for the attributes its __init__ sets."""
    try:
        return owner([]) if owner.__name__ == "Strip" else owner()
    except TypeError:  # abstract, or needs arguments: its class attributes only
        return None


def has(owner: type, name: str) -> bool:
    return hasattr(owner, name) or hasattr(fresh(owner), name)


def is_rankdeck(cls: type) -> bool:
    return cls.__module__.startswith("console.")


class Source:
    """One console/tui file: the private names its classes define and every private use."""

    def __init__(self, path: Path):
        self.file = path.name
        self.module = importlib.import_module("console.tui." + path.stem)
        self.defined: dict[str, set[str]] = {}  # class name -> private names it defines
        self.uses: list[tuple[int, str, str | None, bool]] = []  # line, name, class, on self
        tree = ast.parse(path.read_text())
        self._visit(tree, None)

    def _visit(self, node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                self.defined.setdefault(child.name, set())
                self._visit(child, child.name)
                continue
            if cls is not None:
                self._note_definition(child, node, cls)
            if isinstance(child, ast.Attribute) and PRIVATE.match(child.attr):
                on_self = isinstance(child.value, ast.Name) and child.value.id in ("self", "cls")
                self.uses.append((child.lineno, child.attr, cls, on_self))
            self._visit(child, cls)

    def _note_definition(self, node: ast.AST, parent: ast.AST, cls: str) -> None:
        names = self.defined[cls]
        in_body = isinstance(parent, ast.ClassDef)
        if in_body and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif in_body and isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
        if in_body and isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))


def sources() -> dict[str, Source]:
    return {path.name: Source(path) for path in sorted(TUI.glob("*.py"))}


def own_names(cls: type, every: dict[str, Source]) -> set[str]:
    """The private names rankdeck's classes in ``cls``'s MRO define."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if is_rankdeck(klass):
            source = every[klass.__module__.rsplit(".", 1)[1] + ".py"]
            names |= source.defined.get(klass.__name__, set())
    return {name for name in names if PRIVATE.match(name)}


def unlisted_uses(every: dict[str, Source]) -> list[str]:
    found = []
    for source in every.values():
        for line, name, cls, on_self in source.uses:
            if (name, source.file) in LISTED:
                continue
            if on_self and cls is not None:
                if name in own_names(getattr(source.module, cls), every):
                    continue  # rankdeck's own attribute
            found.append("%s:%d %s" % (source.file, line, name))
    return found


def hidden_textual_names(every: dict[str, Source]) -> list[str]:
    found = []
    for source in every.values():
        for cls_name, names in source.defined.items():
            cls = getattr(source.module, cls_name)
            textual_base = next((k for k in cls.__mro__ if not is_rankdeck(k)), object)
            if not textual_base.__module__.startswith("textual"):
                continue
            found += ["%s %s.%s (on %s)" % (source.file, cls_name, name, textual_base.__name__)
                      for name in sorted(names)
                      if PRIVATE.match(name) and (name, source.file) not in LISTED
                      and has(textual_base, name)]
    return found


def test_every_listed_internal_is_on_the_installed_textual():
    missing, changed = [], []
    for internal in TEXTUAL_INTERNALS:
        if not has(internal.owner, internal.name):
            missing.append("%s.%s (%s)" % (internal.owner.__name__, internal.name,
                                           internal.used_in))
        elif internal.args is not None:
            method = getattr(internal.owner, internal.name)
            try:
                inspect.signature(method).bind(None, *range(internal.args))
            except TypeError as error:
                changed.append("%s.%s: %s" % (internal.owner.__name__, internal.name, error))
    assert not missing and not changed, (
        "Textual %s lacks or changed private names console/tui relies on (see "
        "console/tui/internals.py; pyproject pins the version they were checked on):\n%s"
        % (textual.__version__, "\n".join(missing + changed)))


def test_each_listed_internal_is_used_where_the_list_says():
    every = sources()
    used = {(name, source.file) for source in every.values()
            for _line, name, _cls, _self in source.uses}
    stale = sorted(pair for pair in LISTED if pair not in used)
    assert not stale, "listed in console/tui/internals.py but not used there: %s" % stale


def test_console_tui_uses_no_unlisted_private_textual_name():
    found = unlisted_uses(sources())
    assert not found, (
        "private names used on another object than self, or on self where rankdeck does not "
        "define them: list each Textual one in console/tui/internals.py (with why), or use "
        "Textual's public API; if it is rankdeck's own, make it public:\n" + "\n".join(found))


def test_no_rankdeck_class_overrides_a_private_textual_name():
    found = hidden_textual_names(sources())
    assert not found, (
        "these override or hide a private name of the Textual class below them; use the "
        "public handler (on_focus, not _on_focus), rename, or list it in "
        "console/tui/internals.py:\n" + "\n".join(found))
