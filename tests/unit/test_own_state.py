"""The suite leaves the user's own rankdeck state alone (tests/own_state.py): a console that a
test starts, however its environment was made, keeps its run records in a temp folder, never
in the real one the user's `rankdeck ls` lists; and a run of the suite recorded there anyway
fails the session."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.cli import REPO, console_env, own_folders, runs_folder
from tests.own_state import FOLDER_VARS, REAL, RealState, leaked

# as a test module that builds its children's environment once, at import
AT_IMPORT = dict(os.environ, PYTHONPATH=REPO)

RUNS_FOLDER = "from console.records.history import state_dir; print(state_dir())"


def runs_folder_of(env: dict[str, str]) -> str:
    """The folder of run records a console started with ``env`` writes to."""
    out = subprocess.run([sys.executable, "-c", RUNS_FOLDER], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def inside(path: str, folder: str) -> bool:
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == \
        os.path.abspath(folder)


def test_an_environment_copied_at_import_already_has_the_sessions_temp_folders(request):
    real = request.config.stash[REAL]
    for var in FOLDER_VARS:
        assert inside(AT_IMPORT[var], real.temp), (var, AT_IMPORT[var])
    written = runs_folder_of(AT_IMPORT)
    assert inside(written, real.temp) and not inside(written, real.runs), written


def test_a_console_child_keeps_its_runs_in_the_tests_own_folder(request):
    real = request.config.stash[REAL]
    written = runs_folder_of(console_env())
    assert written == runs_folder() and not inside(written, real.runs), written
    # an environment built from nothing, given the test's folders as tests/cli.py says
    bare = dict(PATH=os.environ.get("PATH", "/usr/bin:/bin"), PYTHONPATH=REPO, **own_folders())
    assert runs_folder_of(bare) == runs_folder()


def test_the_sessions_check_fails_on_a_run_of_its_own_in_the_real_folder(tmp_path):
    """The check at the session's end (tests/conftest.py) on a stand-in real folder: a record
    naming the session's temp folder is the suite's; one that names none is someone else's."""
    runs = tmp_path / "real-runs"
    runs.mkdir()
    (runs / "old.json").write_text('{"workdir": "/home/me/proj"}')
    real = RealState(str(runs), {"old.json"}, str(tmp_path / "t"), {}, (str(tmp_path / "t"),))
    assert leaked(real) == ([], [])
    (runs / "20260101-000000-beef.json").write_text(
        '{"hosts": [{"workdir": "%s"}]}' % (tmp_path / "t" / "test_x0" / "work"))
    (runs / "20260101-000001-cafe.json").write_text('{"workdir": "/home/me/proj"}')
    # another session's temp folder, whose name starts as this one's does
    (runs / "20260101-000002-f00d.json").write_text('{"workdir": "%s"}' % (tmp_path / "t5" / "w"))
    assert leaked(real) == (["20260101-000000-beef.json"],
                            ["20260101-000001-cafe.json", "20260101-000002-f00d.json"])
