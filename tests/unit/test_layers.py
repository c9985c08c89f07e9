"""The import layers hold: import-linter's contracts in pyproject.toml ([tool.importlinter]).

The contracts are over packages, the folders that say which process runs the code
(docs/LAYOUT.md). console/ only imports downwards (verbs -> tui -> run -> slurm ->
surgery | judgement | records | launch -> transport -> model -> lines -> errors) and only the
verbs and tui/ import Textual or Rich; the agent imports no console, inventory, trainer or
third-party UI/SSH/YAML package, and its own packages only import downwards too (serve |
supervisor -> judge -> store -> node -> surgery -> torchrun | slurm | sync -> host | formats ->
rules -> wire); the console takes from the agent only agent.wire and agent.rules (an
allow-list); inventory never imports the console; the trainer imports neither console nor
agent. Imports inside functions count too.
"""

import os
import shutil
import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The agent packages the console may import: the wire and the rules both sides apply.
CONSOLE_TAKES = {"agent.wire", "agent.rules"}


def lint_imports() -> str:
    """The `lint-imports` of this interpreter's environment (the test extra installs it)."""
    beside = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    found = beside if os.path.exists(beside) else shutil.which("lint-imports")
    assert found, "lint-imports not found: pip install -e '.[test]' (import-linter)"
    return found


def test_import_contracts_are_kept():
    # --no-cache: several test runs share the checkout; nothing is written into it
    out = subprocess.run([lint_imports(), "--no-cache", "--no-logo"], cwd=REPO,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, "import contracts broken:\n%s%s" % (out.stdout, out.stderr)
    assert "0 broken" in out.stdout, out.stdout


def agent_children() -> set:
    """agent's packages and top-level modules, by their dotted names."""
    names = set()
    for n in os.listdir(os.path.join(REPO, "agent")):
        path = os.path.join(REPO, "agent", n)
        if n.endswith(".py") and n != "__init__.py":
            names.add("agent." + n[:-3])
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            names.add("agent." + n)
    return names


def test_the_console_may_import_only_the_agents_wire_and_rules():
    # a forbidden contract names packages one by one: a new agent package must be added to it
    # (or to CONSOLE_TAKES, on purpose), else the console could import it unchecked
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    wire_only = next(c for c in contracts if c["id"] == "console-agent-wire-only")
    agent = agent_children()
    assert CONSOLE_TAKES <= agent
    assert set(wire_only["forbidden_modules"]) == agent - CONSOLE_TAKES


# The agent's top-level modules: its entry point (`python -m agent ...`) and the package's own
# file. Everything else lives in a package named for the process that runs it or what it is
# about; a new flat module would bring back the folder where no path said who runs the code.
AGENT_TOP = {"agent.__main__"}


def test_no_new_top_level_agent_module():
    flat = {n for n in agent_children() if os.path.isfile(
        os.path.join(REPO, *n.split(".")) + ".py")}
    assert flat == AGENT_TOP, "agent modules outside a package: %s; give each its package " \
        "(docs/LAYOUT.md) and its layer in pyproject.toml" % sorted(flat - AGENT_TOP)
