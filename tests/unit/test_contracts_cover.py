"""Every module of the console is held to the import layers (pyproject.toml's `console-layers`
contract), and every one outside tui/ to the no-Textual rule: a module added without a layer
would otherwise import anything, and nothing would say so (console/lines/timeorder.py was)."""

from __future__ import annotations

import os

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def contracts() -> dict:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        found = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return {c["id"]: c for c in found}


def console_modules() -> set[str]:
    """console's top-level modules and packages, by their names."""
    names = set()
    for entry in os.listdir(os.path.join(REPO, "console")):
        path = os.path.join(REPO, "console", entry)
        if entry.endswith(".py") and entry != "__init__.py":
            names.add(entry[:-3])
        elif os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py")):
            names.add(entry)
    return names


def test_every_console_package_is_in_a_layer():
    layered = {name.strip() for layer in contracts()["console-layers"]["layers"]
               for name in layer.split("|")}
    missing = sorted(console_modules() - layered)
    assert missing == [], "console packages in no layer of console-layers: %s" % missing


def test_every_console_package_below_the_views_is_kept_from_textual():
    held = {m.split(".", 1)[1] for m in contracts()["console-core-no-textual"]["source_modules"]}
    # the views (they may import Textual, lazily or not) and the entry point above them
    free = {"__main__", "verbs", "tui"}
    missing = sorted(console_modules() - held - free)
    assert missing == [], "console packages not held to the no-Textual rule: %s" % missing
    assert "verbs.headless" in held  # --no-tui is a view without Textual


# console's top-level modules: the entry point and errors (every layer's ground floor)
CONSOLE_TOP = {"__main__", "errors"}


def test_no_new_top_level_console_module():
    flat = {n for n in console_modules()
            if os.path.isfile(os.path.join(REPO, "console", n + ".py"))}
    assert flat == CONSOLE_TOP, "console modules outside a package: %s" % sorted(flat - CONSOLE_TOP)
