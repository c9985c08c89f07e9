"""The import layers hold: import-linter's contracts in pyproject.toml ([tool.importlinter]).

console/ only imports downwards (cli -> commands -> tui | headless -> run -> preflight ->
link | scrollback | summary -> state | transport | history | stacks -> ... -> errors) and
only tui/ imports Textual or Rich; the agent imports no console, inventory, trainer or
third-party UI/SSH/YAML package; inventory never imports the console; the trainer imports
neither console nor agent. Imports inside functions count too.
"""

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
