"""`rankdeck ARGS` as a user's shell runs it: ``python -m console`` in a new process.

The child gets this process's environment, whose state and cache folders are the test's own
(tests/own_state.py), with the repository first on its path. ``env`` adds variables on top
(or is a whole environment made by :func:`console_env`, which comes to the same).
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.own_state import FOLDER_VARS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = [sys.executable, "-m", "console"]
# for a console whose output a test reads as it comes, and the processes it leaves running
UNBUFFERED = {"PYTHONUNBUFFERED": "1"}


def console_env(**extra: str) -> dict[str, str]:
    """The environment of a console child, read now (not at import: a test's fixtures have
    set its state folders by the time it calls)."""
    env = dict(os.environ, PYTHONPATH=REPO)
    env.update(extra)
    return env


def own_folders() -> dict[str, str]:
    """The test's state and cache folders, for a child whose environment is built from
    nothing (else the child's would be the real home's)."""
    return {var: os.environ[var] for var in FOLDER_VARS}


def rankdeck(*args: str, timeout: float = 300, check: bool = False, cwd=REPO,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``rankdeck ARGS`` to its end; its output as text. ``check``: fail the test, with
    the command's output, unless it exits 0."""
    out = subprocess.run(COMMAND + list(args), cwd=str(cwd), env=console_env(**(env or {})),
                         capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError("rankdeck %s: exit %d\n%s\n%s" % (
            " ".join(args), out.returncode, out.stdout[-3000:], out.stderr[-3000:]))
    return out


def start_rankdeck(*args: str, cwd=REPO, env: dict[str, str] | None = None,
                   **popen) -> subprocess.Popen:
    """Start ``rankdeck ARGS`` and leave it running (``popen``: Popen's own options)."""
    return subprocess.Popen(COMMAND + list(args), cwd=str(cwd), env=console_env(**(env or {})),
                            **popen)


def runs_folder() -> str:
    """The test's own folder of run records (``rankdeck ls`` reads it)."""
    return os.path.join(os.environ["XDG_STATE_HOME"], "rankdeck", "runs")


def runs_recorded() -> list[str]:
    """The names in :func:`runs_folder`: empty when nothing was recorded."""
    folder = runs_folder()
    return os.listdir(folder) if os.path.isdir(folder) else []
