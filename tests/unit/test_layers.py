"""The import layers hold: import-linter's contracts in pyproject.toml ([tool.importlinter]).

console/ only imports downwards (cli -> commands -> recorded_verbs -> launch_verbs ->
verb_output | launch_options -> tui | headless -> run -> preflight ->
link | scrollback | summary -> state | transport | history | stacks -> ... -> errors) and
only tui/ imports Textual or Rich; the agent imports no console, inventory, trainer or
third-party UI/SSH/YAML package, and its own modules only import downwards too (serve |
supervisor -> what they do -> ... -> protocol, every module in a layer); the console takes
from the agent only its wire formats, the rules both sides apply and its version (no
host-side module); inventory never imports the console; the trainer imports neither console
nor agent. Imports inside functions count too.
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
# The agent modules the console may import: the wire, the rules both sides apply, the
# judge's notification kinds and the agent's version.
CONSOLE_TAKES = {"agent.protocol", "agent.sync_wire", "agent.judge_wire", "agent.mask",
                 "agent.verdict", "agent.straggler", "agent.judge_notify", "agent.judge_rules",
                 "agent.version", "agent.rendezvous", "agent.rankcpu", "agent.slurm_words"}


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


def test_the_console_is_kept_from_every_host_side_agent_module():
    # a forbidden contract names modules one by one: a new agent module must be added to it
    # (or to the wire, CONSOLE_TAKES), else the console could import it unchecked
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    wire_only = next(c for c in contracts if c["id"] == "console-agent-wire-only")
    agent = {"agent." + n[:-3] for n in os.listdir(os.path.join(REPO, "agent"))
             if n.endswith(".py") and n != "__init__.py"}
    assert CONSOLE_TAKES <= agent
    assert set(wire_only["forbidden_modules"]) == agent - CONSOLE_TAKES
