"""Shared fixtures: keep every test out of the real home's rankdeck state and cache.

For the whole session the state and cache folders of this process and every process it
starts are in a temp folder (tests/own_state.py), set before any test module is imported;
then each test gets folders of its own (``isolated_state``), so it sees only the runs it
recorded. At the session's end, a record of one of its runs in the real folder of run
records (the user's ``rankdeck ls``) fails the session.
"""

from __future__ import annotations

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.own_state import REAL, divert, leaked, put_back  # noqa: E402


def pytest_configure(config):
    config.stash[REAL] = divert()


def pytest_unconfigure(config):
    if REAL in config.stash:
        put_back(config.stash[REAL])


@pytest.fixture(scope="session", autouse=True)
def _session_temp(request, tmp_path_factory):
    """Adds the tests' tmp_path folders to what a leaked run record would name."""
    real = request.config.stash[REAL]
    real.marks = (real.temp, str(tmp_path_factory.getbasetemp()))


def pytest_sessionfinish(session):
    if REAL not in session.config.stash:
        return
    real = session.config.stash[REAL]
    ours, others = leaked(real)
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    if ours:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if report:
            report.ensure_newline()
            report.write_sep("=", "the real run history was written", red=True)
            report.write_line("runs of this session are now in %s (the user's `rankdeck ls`):"
                              " %s" % (real.runs, ", ".join(ours)))
            report.write_line("a test started a console without the test's state folders in "
                              "its environment: use tests/cli.py (rankdeck, console_env, "
                              "own_folders)")
    elif others and report:
        report.write_line("note: %d run record(s) appeared in %s during the session, none "
                          "naming its temp folders (another rankdeck on this machine?)"
                          % (len(others), real.runs))


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory, monkeypatch):
    """XDG state/cache dirs in a temp folder of the test's own: run history never lands in
    the real home, and a test sees only the runs it recorded."""
    base = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    return base


@pytest.fixture
def own_home(tmp_path, monkeypatch):
    """HOME and the state folder in the test's tmp_path (``home``, ``state``), for tests of
    the app, which may write under HOME."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"
