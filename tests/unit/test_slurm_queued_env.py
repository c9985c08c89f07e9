"""`submit --detach` of a job that waits keeps no `--env` value on disk (issue 40): the queued
run's file (console/slurm/queued.py) keeps the names alone; the follower gets the values from
the submit through its stdin, and a `status` or `attach` that launches in its place reads them
again from its shell, refusing (naming the variable) when one is not exported. The login host
answers through a stand-in for the one transport call Slurm needs (tests/slurm has a real
Slurm); the follower is a real process reading a real pipe."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import pytest

from console.errors import UsageError
from console.slurm import queued as slurm_queued
from console.verbs import cli, launch as launch_verbs

SECRET = "s3cret-value-9f21c7"  # a value of a name the inventory marks secret
PLAIN = "plain-but-private-4d8e"  # a value of a name it does not: never on disk either


class Login:
    """The login host of a cluster where the job waits: sbatch takes it, squeue says PENDING
    (FAILED from its third look on: a submit that waits for it ends), or RUNNING once
    ``running`` is set."""

    def __init__(self):
        self.running = False
        self.looks = 0

    async def on_login(self, login, argv, timeout=60, input=None):
        if argv[0] == "sbatch":
            return 0, "41\n", ""
        self.looks += 1
        state = "RUNNING|None" if self.running else \
            "PENDING|Resources" if self.looks < 3 else "FAILED|None"
        return 0, "%s|10:00|\n" % state, ""

    async def cgroup_site(self, login):
        return False

    async def close(self):
        pass


def inventory(tmp_path):
    path = tmp_path / "login.yaml"
    path.write_text("hosts:\n  - name: login\n    ssh: login.example\n    addr: 10.0.0.2\n"
                    "    env:\n      TOKEN: {value: x, secret: true}\n")
    return str(path)


def on_disk(folder) -> str:
    return "".join(p.read_text() for p in folder.rglob("*") if p.is_file())


async def submit_detached(tmp_path, monkeypatch, login):
    followers = []
    monkeypatch.setattr(launch_verbs, "make_transport", lambda *_a: login)
    monkeypatch.setattr(slurm_queued, "start_follower",
                        lambda run_id, env_values=None: followers.append(env_values) or 4242)
    args = cli.build_parser().parse_args([
        "submit", "-i", inventory(tmp_path), "--nodes", "2", "--time", "10", "--detach",
        "--env", "TOKEN=" + SECRET, "--env", "PLAIN=" + PLAIN, "train.py"])
    assert await launch_verbs.cmd_submit(args) == 0
    return followers


async def test_the_queued_file_keeps_env_names_and_the_follower_gets_the_values(
        tmp_path, monkeypatch, capsys):
    followers = await submit_detached(tmp_path, monkeypatch, Login())
    run_id = capsys.readouterr().out.strip()
    state = os.path.dirname(slurm_queued.queued_path(run_id))
    text = on_disk(type(tmp_path)(state).parent)  # queued/ and every file beside it
    assert run_id in text
    assert SECRET not in text and PLAIN not in text, text
    kept = slurm_queued.queued(run_id)["options"]
    assert kept["env_names"] == ["PLAIN", "TOKEN"] and kept["env"] == []
    assert followers == [{"TOKEN": SECRET, "PLAIN": PLAIN}]


def test_no_env_value_of_any_name_is_kept(tmp_path):
    args = argparse.Namespace(sync=None, env=["PLAIN=" + PLAIN, "EMPTY="], nodes=2)
    run_id = slurm_queued.keep(args, "41", "#!/bin/sh\n", str(tmp_path / "login.yaml"))
    with open(slurm_queued.queued_path(run_id)) as f:
        text = f.read()
    assert PLAIN not in text and "PLAIN" in text, text
    assert slurm_queued.queued(run_id)["options"]["env_names"] == ["EMPTY", "PLAIN"]


async def test_a_launch_in_the_follower_s_place_reads_the_values_from_this_shell(
        tmp_path, monkeypatch, capsys):
    login = Login()
    await submit_detached(tmp_path, monkeypatch, login)
    run_id = capsys.readouterr().out.strip()
    monkeypatch.setattr(slurm_queued, "make_transport", lambda *_a: login)
    monkeypatch.setattr(slurm_queued, "mark_submitted", lambda *_a: None)
    launched = []

    async def launch(args):
        launched.append(sorted(args.env))

    login.running = True
    monkeypatch.delenv("PLAIN", raising=False)
    monkeypatch.setenv("TOKEN", SECRET)
    with pytest.raises(UsageError, match=r"--env PLAIN is never written to disk.*export PLAIN"):
        await slurm_queued.follow(run_id, launch)
    assert launched == [] and slurm_queued.queued(run_id) is not None  # still queued
    # the follower's values first (from the submit), then this shell's
    assert await slurm_queued.follow(run_id, launch, env={"PLAIN": PLAIN}) is None
    assert launched == [["PLAIN=" + PLAIN, "TOKEN=" + SECRET]]
    assert slurm_queued.queued(run_id) is None


def test_the_follower_is_handed_the_values_on_its_stdin(tmp_path, monkeypatch):
    """The real start: a process whose stdin is a pipe (here one that writes what it read),
    the values neither in its environment nor in its arguments."""
    from console.verbs.slurm_follower import given_env
    got = tmp_path / "stdin"
    child = tmp_path / "python"
    child.write_text("#!/bin/sh\nenv > %s.env\necho \"$@\" > %s.args\ncat > %s.tmp && "
                     "mv %s.tmp %s\n" % ((got,) * 5))
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    os.makedirs(os.path.dirname(slurm_queued.queued_path("r1")), exist_ok=True)
    slurm_queued.start_follower("r1", {"TOKEN": SECRET})
    deadline = time.monotonic() + 60
    while not got.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads(got.read_text()) == {"env": {"TOKEN": SECRET}}
    seen = (tmp_path / "stdin.env").read_text() + (tmp_path / "stdin.args").read_text()
    assert SECRET not in seen and "console.verbs.slurm_follower r1" in seen
    assert given_env(io.StringIO(got.read_text())) == {"TOKEN": SECRET}
    assert given_env(io.StringIO("")) == {} and given_env(io.StringIO("[1]")) == {}
