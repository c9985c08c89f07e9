"""What the login host says reaches the terminal cleaned, as every other host text does (issue
40): squeue's pending reason and start, sinfo's node reasons, sbatch's and scancel's stderr
hold no escape sequence, C1 control or forged line once rankdeck prints them, and Rich markup
in them stays plain text. The login host here answers through a stand-in for the one
transport call Slurm needs (tests/slurm has a real Slurm)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from console.errors import LaunchError
from console.slurm import slurm, submit

# OSC 52 (write the clipboard), an OSC title, a screen clear, a C1 CSI and OSC, Rich markup
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;owned\x1b\\\x1b[2J\x9b31m\x9d0;t\x9c[bold red]x[/]"
FORGED = "\nnode9: ok"  # a newline that would print a line of its own
RAW = re.compile("[\x1b\x07\x80-\x9f]")
LOGIN = SimpleNamespace(ssh="login.example", name="login")


class Login:
    """The login host: each command's answer (exit code, stdout, stderr) by its name."""

    def __init__(self, **answers):
        self.answers = {k: list(v) if isinstance(v, list) else [v] for k, v in answers.items()}

    async def on_login(self, login, argv, timeout=60, input=None):
        queue = self.answers[argv[0]]
        return queue.pop(0) if len(queue) > 1 else queue[0]


def assert_clean(text: str, *present: str) -> None:
    assert not RAW.search(text), repr(text)
    assert "\n" not in text, "a login host's newline forged a line: %r" % text
    for part in present:
        assert part in text, (part, text)


async def test_the_pending_reason_and_start_are_printed_cleaned():
    host = Login(squeue=[(0, "PENDING|Resources%s|1:00|\n" % HOSTILE, ""),
                         (0, "2026-11-26T05:00:00%s\n" % HOSTILE, ""),
                         (0, "RUNNING|None|0:59|\n", "")])
    said = []
    await submit.wait_running(host, LOGIN, "12", said.append, every=0)
    assert len(said) == 1
    assert_clean(said[0], "Slurm job 12 PENDING", "Resources", "2026-11-26T05:00:00",
                 "[bold red]x[/]")


async def test_a_job_that_ended_before_it_ran_says_so_cleaned():
    host = Login(squeue=(0, "FAILED%s|Launch%s|0:00|\n" % (HOSTILE, HOSTILE), ""))
    with pytest.raises(LaunchError) as err:
        await submit.wait_running(host, LOGIN, "12", print, every=0)
    assert_clean(str(err.value), "ended before it ran", "Launch")


async def test_scancel_s_and_sbatch_s_stderr_are_one_clean_line():
    host = Login(scancel=(1, "", "scancel: error: %s%s" % (HOSTILE, FORGED)),
                 sbatch=(1, "", "sbatch: error: %s%s" % (HOSTILE, FORGED)))
    assert_clean(await submit.cancel(host, LOGIN, "12"), "could not cancel", "scancel: error")
    with pytest.raises(LaunchError) as err:
        await submit.submit(host, LOGIN, "#!/bin/sh\n")
    assert_clean(str(err.value), "sbatch on the login host refused", "node9: ok")


async def test_sinfo_s_node_reasons_and_squeue_s_errors_are_cleaned():
    host = Login(sinfo=(0, "node1|drained%s|disk full%s\n" % (HOSTILE, HOSTILE), ""),
                 squeue=(1, "", "squeue: error: %s%s" % (HOSTILE, FORGED)))
    job, nodes = await slurm.job_and_nodes(host, [LOGIN, SimpleNamespace(name="node1")], "12")
    assert_clean(nodes["node1"], "drained", "disk full")
    assert job["state"] == "UNKNOWN"
    assert_clean(job["reason"], "squeue: error")
    status = slurm.with_job({"state": "running"}, dict(job, state="CANCELLED"))
    assert_clean(status["slurm"]["ended"], "was cancelled", "squeue: error")


async def test_scontrol_s_refusal_at_launch_is_cleaned():
    host = Login(scontrol=(1, "", "scontrol: error: %s%s" % (HOSTILE, FORGED)))
    with pytest.raises(LaunchError) as err:
        await slurm.read_job(host, LOGIN, "12")
    assert_clean(str(err.value), "scontrol show job 12", "scontrol: error")
