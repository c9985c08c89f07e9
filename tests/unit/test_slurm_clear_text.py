"""On Slurm the agents' traffic leaves SSH at the login host: srun carries it to the nodes,
encrypted only where the site set Slurm up with TLS (issue 40). `launch --slurm` and `submit`
say so on stderr, before anything is sent, when the run has secret values; once per submit
(before sbatch), not again at its launch. The login host answers through a stand-in for the
one transport call Slurm needs (tests/slurm has a real Slurm); the launch stops where the
agents would be reached."""

from __future__ import annotations

import pytest

from console.verbs import cli, launch as launch_verbs

SECRET = "s3cret-value-9f21c7"
WARNING = "cross the cluster network in clear"


class Reached(Exception):
    """The launch went on to reach the nodes' agents: the test ends there."""


class Login:
    """A login host whose job 41 runs on n1 and n2 (sbatch gives job 41); ``said``: the
    console's stderr so far, read when sbatch is asked."""

    def __init__(self, capsys):
        self.capsys, self.said = capsys, None

    async def on_login(self, login, argv, timeout=60, input=None):
        answers = {
            ("sbatch",): "41\n",
            ("scancel",): "",
            ("squeue",): "RUNNING|None|10:00|\n",
            ("scontrol", "show", "job"): "JobId=41 JobState=RUNNING Reason=None NodeList=n[1-2]\n",
            ("scontrol", "show", "hostnames"): "n1\nn2\n",
            ("scontrol", "show", "node"): "NodeName=n1 NodeAddr=10.0.0.5\n"
                                          "NodeName=n2 NodeAddr=10.0.0.6\n",
            ("scontrol", "show", "config"): "ProctrackType = proctrack/linuxproc\n",
            ("getent",): "10.0.0.5 STREAM n1\n",
        }
        if argv[0] == "sbatch":
            out = self.capsys.readouterr()
            self.said = out.err
        key = next(k for k in answers if tuple(argv[:len(k)]) == k)
        return 0, answers[key], ""

    async def cgroup_site(self, login):
        return False

    async def close(self):
        pass


def inventory(tmp_path, secret: bool):
    path = tmp_path / "login.yaml"
    env = "    env:\n      TOKEN: {value: inventory-secret-5e1d, secret: true}\n" if secret else ""
    path.write_text("hosts:\n  - name: login\n    ssh: login.example\n    addr: 10.0.0.2\n"
                    "    python: python3\n    workdir: /w\n" + env)
    return str(path)


def transports(login):
    """make_transport: the login host for the Slurm questions; the agents are not reached."""
    def make(kind, *_a):
        if getattr(make, "agents", False):
            raise Reached(kind)
        return login
    return make


async def run(tmp_path, monkeypatch, capsys, argv):
    login = Login(capsys)
    make = transports(login)
    monkeypatch.setattr(launch_verbs, "make_transport", make)
    real_start = launch_verbs.start_run

    async def start_run(*a):
        make.agents = True  # from here on, the nodes' agents
        return await real_start(*a)

    monkeypatch.setattr(launch_verbs, "start_run", start_run)
    args = cli.build_parser().parse_args(argv)
    with pytest.raises(Reached, match="slurm:41"):
        await (launch_verbs.cmd_submit(args) if argv[0] == "submit"
               else launch_verbs.cmd_launch(args))
    return login, capsys.readouterr().err


async def test_launch_slurm_with_a_secret_warns_before_anything_is_sent(
        tmp_path, monkeypatch, capsys):
    _login, err = await run(tmp_path, monkeypatch, capsys, [
        "launch", "-i", inventory(tmp_path, secret=True), "--slurm", "41",
        "--env", "TOKEN=" + SECRET, "train.py"])
    assert err.count(WARNING) == 1, err
    assert "2 secret values" in err and "docs/SECURITY.md" in err and SECRET not in err


async def test_launch_slurm_without_secrets_does_not_warn(tmp_path, monkeypatch, capsys):
    _login, err = await run(tmp_path, monkeypatch, capsys, [
        "launch", "-i", inventory(tmp_path, secret=False), "--slurm", "41", "train.py"])
    assert WARNING not in err, err


async def test_submit_warns_once_before_sbatch(tmp_path, monkeypatch, capsys):
    login, err = await run(tmp_path, monkeypatch, capsys, [
        "submit", "-i", inventory(tmp_path, secret=True), "--nodes", "2", "--time", "10",
        "train.py"])
    assert login.said is not None and WARNING in login.said, login.said
    assert WARNING not in err, err  # not again at the launch in the job
