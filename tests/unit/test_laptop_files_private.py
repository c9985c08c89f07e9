"""What the console keeps on the laptop is the user's alone, whatever the login's umask
(issue 29): the runs known here (hosts, run folders, env names) and the sync hash cache (the
paths of the files of every tree synced) are 0600 files in 0700 folders, a folder an older
rankdeck made 0755 included."""

from __future__ import annotations

import os
import stat

import pytest

from console.records.history import History, state_dir
from console.launch.sync import HashCache, build_manifest

RECORD = {"run_id": "20260101-000000-abcd", "created": 1.0, "hosts": [], "state": "running",
          "spec": {"script": "train.py"}}


@pytest.fixture
def login_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def files_of(folder) -> list[str]:
    return [os.path.join(folder, name) for name in os.listdir(folder)]


def test_run_records_are_private(login_umask):
    History().save(RECORD)
    History().save_offsets(RECORD["run_id"], {"node0": 10})
    folder = state_dir()
    assert mode(folder) == 0o700
    assert len(files_of(folder)) == 2
    assert all(mode(p) == 0o600 for p in files_of(folder)), [
        (p, oct(mode(p))) for p in files_of(folder)]


def test_a_runs_folder_made_open_before_is_made_private(login_umask):
    os.makedirs(state_dir(), 0o755)
    History().save(RECORD)
    assert mode(state_dir()) == 0o700


def test_the_sync_hash_cache_is_private(tmp_path, login_umask, monkeypatch):
    monkeypatch.setattr(HashCache, "RACY_SECONDS", -1.0)  # files here are seconds old
    root = tmp_path / "tree"
    root.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    folder = os.path.dirname(HashCache(str(root)).path)
    os.makedirs(folder, 0o755)  # as an older rankdeck left it
    build_manifest(str(root))
    assert mode(folder) == 0o700
    [cache] = files_of(folder)
    assert mode(cache) == 0o600
    assert "train.py" in open(cache).read()
