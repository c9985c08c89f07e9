"""Shared fixtures: keep every test out of the real home's rankdeck state and cache."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory, monkeypatch):
    """XDG state/cache dirs in a temp folder: run history never lands in the real home."""
    base = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    return base
