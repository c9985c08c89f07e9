"""`rankdeck restart` from a new shell keeps the run's environment: the inventory's plain
values come from the run record; secrets and every ``--env`` value (never recorded: only their
names are) from this shell, and a value this shell cannot supply refuses the restart with
exit 2 before any node is touched."""

from __future__ import annotations

import json
import os
import time

import pytest

from console.errors import UsageError
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from inventory.loader import load_inventory

from tests.cli import rankdeck, runs_folder
from tests.console.scripted import RUN_ID, host_names, standard_script
INV_SECRET = "inv-secret-5b0e7d1c9a"  # what ${RD_TOKEN} holds in the launching shell
CLI_SECRET = "cli-secret-77aa12f0e3"  # an --env value for a name the inventory marks secret


def write_inventory(tmp_path) -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text("transport: local\ndefaults:\n  workdir: %s\n  env:\n"
                    "    TOKEN: ${RD_TOKEN}\n    MODE: fast\nhosts:\n"
                    "  - {name: node1, addr: 127.0.0.2}\n  - {name: node2, addr: 127.0.0.3}\n"
                    % tmp_path)
    return str(path)


async def launch_recorded(tmp_path, monkeypatch) -> tuple[str, dict]:
    """Launch over scripted agents with --env LR=0.1 and --env TOKEN=...; the saved record."""
    monkeypatch.setenv("RD_TOKEN", INV_SECRET)
    path = write_inventory(tmp_path)
    t = standard_script(host_names(2), t0=time.time()).transport()
    async with RunController(load_inventory(path), t, History(), run_id=RUN_ID) as ctl:
        await ctl.launch(LaunchSpec(script="train.py", env={"LR": "0.1", "TOKEN": CLI_SECRET}),
                         inventory_path=path)
    with open(History().path(RUN_ID)) as f:
        text = f.read()
    return text, json.loads(text)


async def test_the_record_keeps_plain_values_and_only_the_names_of_secrets_and_env(
        tmp_path, monkeypatch):
    text, record = await launch_recorded(tmp_path, monkeypatch)
    assert INV_SECRET not in text and CLI_SECRET not in text
    # --env values are never recorded (docs/SECURITY.md): one may hold a secret the
    # inventory does not name
    assert record["spec"]["env"] == {"LR": "****", "TOKEN": "****"}
    assert '"0.1"' not in text
    assert record["secret_env"] == ["TOKEN"]
    assert record["hosts"][0]["env"] == {"TOKEN": "****", "MODE": "fast"}


async def test_restart_from_a_new_shell_sends_the_runs_environment(tmp_path, monkeypatch):
    _text, record = await launch_recorded(tmp_path, monkeypatch)
    # a new shell: the inventory's variable and the --env secret's name are exported there
    monkeypatch.setenv("RD_TOKEN", INV_SECRET)
    monkeypatch.setenv("TOKEN", CLI_SECRET)
    monkeypatch.setenv("LR", "0.1")
    t = standard_script(host_names(2), t0=time.time()).transport()
    async with RunController.from_record(History().load(RUN_ID), t, History()) as ctl:
        await ctl.connect_all(reconnect=False)
        await ctl.restart("node2")
    (req,) = [r for r in t.requests if r.op == "restart"]
    assert req.node == "node2"
    # --env overrides the inventory's TOKEN, as at launch
    assert req.args["spec"]["env"] == {"TOKEN": CLI_SECRET, "MODE": "fast", "LR": "0.1"}
    assert req.args["spec"]["secret_env"] == ["TOKEN"]
    assert CLI_SECRET in ctl.secrets and INV_SECRET in ctl.secrets  # masked in its output
    assert "0.1" not in ctl.secrets  # read again like a secret, but not one


async def test_an_env_value_not_exported_refuses_the_restart(tmp_path, monkeypatch):
    _text, record = await launch_recorded(tmp_path, monkeypatch)
    monkeypatch.setenv("TOKEN", CLI_SECRET)
    monkeypatch.delenv("LR", raising=False)
    t = standard_script(host_names(2), t0=time.time()).transport()
    async with RunController.from_record(History().load(RUN_ID), t, History()) as ctl:
        await ctl.connect_all(reconnect=False)
        with pytest.raises(UsageError) as err:
            await ctl.restart("node1")
    assert "--env LR is never recorded; export LR in this shell" in str(err.value)
    assert t.ops("restart") == [] and t.ops("stop") == []


async def test_an_unset_inventory_secret_refuses_the_restart(tmp_path, monkeypatch):
    _text, record = await launch_recorded(tmp_path, monkeypatch)
    monkeypatch.delenv("RD_TOKEN")
    monkeypatch.setenv("TOKEN", CLI_SECRET)
    monkeypatch.setenv("LR", "0.1")
    t = standard_script(host_names(2), t0=time.time()).transport()
    async with RunController.from_record(History().load(RUN_ID), t, History()) as ctl:
        await ctl.connect_all(reconnect=False)
        with pytest.raises(UsageError) as err:
            await ctl.restart("node1")
    message = str(err.value)
    assert "nothing was stopped or restarted" in message
    assert "environment variable RD_TOKEN is not set on this machine" in message
    assert "export it" in message
    assert t.ops("restart") == [] and t.ops("stop") == []


def test_restart_command_is_exit_2_naming_the_variable_before_connecting(tmp_path,
                                                                          monkeypatch):
    path = write_inventory(tmp_path)
    folder = runs_folder()
    os.makedirs(folder)
    record = {"run_id": RUN_ID, "created": 0, "transport": "local", "inventory": path,
              # a python that does not exist: connecting would fail with exit 3
              "hosts": [{"name": "node1", "addr": "127.0.0.2", "python": "/nonexistent/py",
                         "workdir": str(tmp_path), "env": {"TOKEN": "****", "MODE": "fast"}}],
              "spec": {"script": "t.py", "env": {"LR": "0.1"}}, "secret_env": []}
    with open(os.path.join(folder, RUN_ID + ".json"), "w") as f:
        json.dump(record, f)
    monkeypatch.delenv("RD_TOKEN", raising=False)
    out = rankdeck("restart", RUN_ID, "--node", "node1")
    assert out.returncode == 2, out
    assert "cannot restart node1" in out.stderr
    assert "RD_TOKEN is not set on this machine" in out.stderr
    assert "unreachable" not in out.stderr and "no-python" not in out.stderr


def test_an_older_record_without_values_takes_env_from_this_shell(tmp_path, monkeypatch):
    record = {"run_id": RUN_ID, "created": 0, "transport": "local", "inventory": "",
              "hosts": [{"name": "node1", "addr": "127.0.0.2", "python": "",
                         "workdir": str(tmp_path), "env": {"MODE": "fast"}}],
              "spec": {"script": "t.py", "env": {"LR": "****"}}}
    ctl = RunController.from_record(record, LocalTransport(), History(str(tmp_path)))
    with pytest.raises(UsageError) as err:
        ctl.check_restartable("node1")
    assert "--env LR is never recorded; export LR" in str(err.value)
    monkeypatch.setenv("LR", "0.3")
    ctl = RunController.from_record(record, LocalTransport(), History(str(tmp_path)))
    ctl.check_restartable("node1")
    assert ctl.spec.env == {"LR": "0.3"}
    assert ctl.node_spec(ctl.inventory.host("node1"), ctl.spec, "x:1")["env"] == {
        "MODE": "fast", "LR": "0.3"}
