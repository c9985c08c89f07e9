"""The runs recorded on this laptop: concurrent writers never corrupt a record, and a record
that cannot be read is named with its path (status, attach: exit 2) or skipped by `ls`."""

from __future__ import annotations

import json
import os
import threading

import pytest

from console.verbs import cli
from console.records.history import BadRecord, History

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


GOOD_HOST = {"name": "node0", "addr": "10.0.0.1", "ssh": None, "python": "python3",
             "workdir": "~", "slots": 1, "gpus": 0, "env": {}}


@pytest.mark.parametrize("change,reason", [
    ({"created": "yesterday"}, "created is 'yesterday', not a number"),
    ({"hosts": [{}]}, "hosts[0].name is missing"),
    ({"hosts": [dict(GOOD_HOST, slots="8")]}, "hosts[0].slots is '8'"),
    ({"hosts": ["node0"]}, "hosts[0] is not an object"),
    ({"spec": {"script": "t.py", "frobnicate": 1}}, "unknown key 'frobnicate'"),
    ({"spec": {"script": "t.py", "args": "--lr 3"}}, "spec.args is '--lr 3', not a list"),
    ({"spec": {"script": "t.py", "max_restarts": True}}, "spec.max_restarts is True"),
    ({"run_id": "../../etc"}, "is not a run id"),
    ({"status": {"nodes": [5]}}, "status.nodes is not a list"),
    ({"run_roots": []}, "run_roots is [], not an object"),
])
def test_a_record_of_the_wrong_shape_is_named_not_a_traceback(history, capsys, change, reason):
    """JSON of the wrong shape (a hand edit, another version) used to give a traceback in `ls`
    and `status`; one bad record broke `ls` for every run."""
    history.save(dict(RECORD, run_id="20260101-000000-good", hosts=[GOOD_HOST]))
    bad = dict(dict(RECORD, hosts=[GOOD_HOST]), **change)
    os.makedirs(history.folder, exist_ok=True)
    path = history.path("20260101-000000-abcd")
    with open(path, "w") as f:
        json.dump(bad, f)
    assert cli.main(["status", "20260101-000000-abcd"]) == 2
    out = capsys.readouterr()
    assert path in out.err and reason in out.err, out.err
    assert "Traceback" not in out.err
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr()
    assert "20260101-000000-good" in out.out and "skipped" in out.err and reason in out.err


def test_the_record_check_knows_every_field_of_the_launch_spec():
    import dataclasses

    from console.records.history import SPEC_FIELDS
    from console.launch.spec import LaunchSpec
    assert set(SPEC_FIELDS) == {f.name for f in dataclasses.fields(LaunchSpec)}


def test_a_record_written_by_a_launch_reads_back(history):
    from console.records.history import host_record, record_problem
    from inventory.model import Host
    record = dict(RECORD, hosts=[host_record(Host("node0", "10.0.0.1"))],
                  spec={"script": "t.py", "args": [], "module": False, "grace": 10.0,
                        "launcher": None, "env": {"A": "****"}},
                  run_roots={"node0": "~/.rankdeck/runs/x"}, secret_env=["A"])
    assert record_problem(record) is None
