"""The runs recorded on this laptop: concurrent writers never corrupt a record, and a record
that cannot be read is named with its path (status, attach: exit 2) or skipped by `ls`."""

from __future__ import annotations

import json
import os
import threading

import pytest

from console import cli
from console.history import BadRecord, History

RECORD = {"run_id": "20260101-000000-abcd", "created": 1.0, "hosts": [], "state": "running",
          "spec": {"script": "train.py"}}


@pytest.fixture
def history(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return History()


def test_two_writers_of_one_record_never_collide(history):
    errors = []

    def writer(tag: str) -> None:
        try:
            for i in range(300):
                history.save(dict(RECORD, status={"writer": tag, "i": i, "pad": "x" * 4000}))
        except Exception as exc:  # a shared temp file: renamed away under the other writer
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(tag,)) for tag in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert history.load(RECORD["run_id"])["status"]["i"] == 299
    assert [n for n in os.listdir(history.folder) if n.endswith(".tmp")] == []


@pytest.mark.parametrize("content", ['{"run_id": "20260101-000000-abcd", "hos', "[1, 2]",
                                     '{"state": "running"}'])
def test_a_bad_record_is_named_by_status_and_attach_with_exit_2(history, capsys, content):
    os.makedirs(history.folder)
    path = history.path(RECORD["run_id"])
    with open(path, "w") as f:
        f.write(content)
    with pytest.raises(BadRecord) as err:
        history.load("20260101")
    assert path in str(err.value)
    for verb in (["status", "20260101"], ["attach", "--no-tui", "20260101"]):
        assert cli.main(verb) == 2
        out = capsys.readouterr()
        assert path in out.err and "Traceback" not in out.err


def test_ls_skips_a_bad_record_with_a_warning(history, capsys):
    history.save(RECORD)
    with open(history.path("20260101-000000-bad0"), "w") as f:
        f.write('{"run_id": ')
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr()
    assert RECORD["run_id"] in out.out
    assert "skipped" in out.err and history.path("20260101-000000-bad0") in out.err
    assert cli.main(["ls", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [RECORD["run_id"]]
