"""The suite's state away from the user's: what rankdeck keeps on the laptop (the run records
``rankdeck ls`` lists, console/records/history.py; the sync cache, console/launch/sync.py) goes to temp
folders, never to the real ``~/.local/state/rankdeck`` or ``~/.cache/rankdeck``.

tests/conftest.py wires it: :func:`divert` at the session's start (before any test module is
imported, so an environment a module copies at import has the temp folders too), then a
folder of each test's own, :func:`put_back` at the end, and :func:`leaked` to fail the
session when a run of its own was recorded in the real folder anyway.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest

from console.records.history import state_dir

FOLDER_VARS = ("XDG_STATE_HOME", "XDG_CACHE_HOME")


@dataclass
class RealState:
    """The real folder of run records and what it held before the session; the session's
    temp folder and the values of FOLDER_VARS it replaced."""

    runs: str
    before: set[str]
    temp: str
    saved: dict[str, str | None]
    marks: tuple[str, ...] = ()  # this session's temp folders, as a leaked record names them


REAL = pytest.StashKey[RealState]()


def entries(folder: str) -> set[str]:
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def divert() -> RealState:
    """Point FOLDER_VARS of this process (and so of its children) at a new temp folder."""
    runs = state_dir()  # the real one: read before the environment changes
    temp = tempfile.mkdtemp(prefix="rankdeck-tests-")
    saved = {var: os.environ.get(var) for var in FOLDER_VARS}
    for var in FOLDER_VARS:
        os.environ[var] = os.path.join(temp, var.lower())
    return RealState(runs, entries(runs), temp, saved, (temp,))


def put_back(real: RealState) -> None:
    for var, value in real.saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    shutil.rmtree(real.temp, ignore_errors=True)


def leaked(real: RealState) -> tuple[list[str], list[str]]:
    """(records new in the real folder that name one of this session's temp folders: runs
    of its own; the other new names there: another rankdeck on this machine may write
    meanwhile)."""
    ours, others = [], []
    for name in sorted(entries(real.runs) - real.before):
        try:
            with open(os.path.join(real.runs, name), errors="replace") as f:
                text = f.read()
        except OSError:  # gone again (a write's temporary file), or not a file
            continue
        # a path inside a mark (its separator too: pytest-2 is not pytest-25)
        named = any(os.path.join(mark, "") in text for mark in real.marks)
        (ours if named else others).append(name)
    return ours, others
