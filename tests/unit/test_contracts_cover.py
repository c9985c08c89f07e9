"""Every module of the console is held to the import layers (pyproject.toml's `console-layers`
contract), and every one outside tui/ to the no-Textual rule: a module added without a layer
would otherwise import anything, and nothing would say so (console/timeorder.py was)."""

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
    """console's top-level modules and subpackages (tui, transport), by their names."""
    names = set()
    for entry in os.listdir(os.path.join(REPO, "console")):
        path = os.path.join(REPO, "console", entry)
        if entry.endswith(".py") and entry != "__init__.py":
            names.add(entry[:-3])
        elif os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py")):
            names.add(entry)
    return names


def test_every_console_module_is_in_a_layer():
    layered = {name.strip() for layer in contracts()["console-layers"]["layers"]
               for name in layer.split("|")}
    missing = sorted(console_modules() - layered)
    assert missing == [], "console modules in no layer of console-layers: %s" % missing


def test_every_console_module_below_the_views_is_kept_from_textual():
    held = {m.split(".", 1)[1] for m in contracts()["console-core-no-textual"]["source_modules"]}
    # above the views (they may import Textual, lazily or not) and the views themselves
    free = {"__main__", "slurm_follower", "cli", "commands", "recorded_verbs", "launch_verbs",
            "verb_output", "tui"}
    missing = sorted(console_modules() - held - free)
    assert missing == [], "console modules not held to the no-Textual rule: %s" % missing
