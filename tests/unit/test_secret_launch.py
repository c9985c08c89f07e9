"""A run's secrets reach every masker from the launch on: an ``--env`` value for a secret
name and every ``${VAR}`` filled into a secret are masked by the console from the first line
and by the host; `logs` masks what is left after escape sequences are removed; multi-line
secrets are warned about. Over a scripted agent that masks nothing (an older host, or a
secret the host was not told of), so what is checked is the console's own masking."""

from __future__ import annotations

import argparse
import time

from console.verbs import launch as launch_verbs, recorded as recorded_verbs
from console.records.history import History
from console.run.run import LaunchSpec
from inventory.loader import load_inventory

from tests.console.scripted import RunScript, event

TOKEN = "tk-5a8f0c2e91d4"  # what ${RD_TOKEN} holds in the launching shell
CLI_SECRET = "cli-secret-77aa12f0e3"  # an --env value for a name the inventory marks secret
WHOLE = "wh-9c3e11ab70f2"  # what ${RD_WHOLE} holds: a whole value, secret today too
PEM = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEF\n-----END KEY-----\n"


def write_inventory(tmp_path, extra: str = "") -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text("transport: local\nhosts:\n  - name: node1\n    addr: 127.0.0.2\n"
                    "    workdir: %s\n    env:\n      AUTH: \"Bearer ${RD_TOKEN}\"\n"
                    "      WHOLE: ${RD_WHOLE}\n%s"
                    % (tmp_path, extra))
    return str(path)


def scripted_run(lines: list[str]):
    """One node, one rank that prints ``lines`` and exits 0: its transport."""
    now = time.time()
    s = RunScript(["node1"], nproc=1, t0=now).launched()
    s.lines("node1", 0, lines, now + 1)
    s.recs["node1"].append([event("ended", now + 2, state="exited", exit_code=0)])
    return s.transport()


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**dict(dict(no_tui=True, detach=False, stall_after=60.0,
                                          line_budget=64, skip_preflight=True), **kw))


async def launch(tmp_path, monkeypatch, transport, env=None, extra="") -> None:
    monkeypatch.setenv("RD_TOKEN", TOKEN)
    monkeypatch.setenv("RD_WHOLE", WHOLE)
    monkeypatch.setattr(launch_verbs, "make_transport", lambda *_a: transport)
    path = write_inventory(tmp_path, extra)
    inv = load_inventory(path)
    spec = LaunchSpec(script="train.py", env=dict(env or {}))
    assert await launch_verbs.start_run(inv, spec, args(), path) == 0


async def test_an_env_secret_and_a_filled_variable_are_masked_from_the_first_line(
        tmp_path, monkeypatch, capsys):
    t = scripted_run(["cli %s here" % CLI_SECRET,
                      "cli split \x1b[1m%s\x1b[0m%s" % (CLI_SECRET[:5], CLI_SECRET[5:]),
                      "token alone: %s" % TOKEN,
                      "token split: %s\x1b[31m%s" % (TOKEN[:4], TOKEN[4:])])
    await launch(tmp_path, monkeypatch, t, env={"AUTH": CLI_SECRET},
                 extra="      PLAIN: ${RD_TOKEN:-x}\n")
    out = capsys.readouterr()
    shown = out.out + out.err
    assert "cli **** here" in shown and "cli split ****" in shown, shown
    assert "token alone: ****" in shown and "token split: ****" in shown, shown
    for fragment in (CLI_SECRET, CLI_SECRET[5:], TOKEN, TOKEN[4:]):
        assert fragment not in shown
    # the host is told too: the filled variable's value for masking, AUTH's value by name
    (start,) = [r for r in t.requests if r.op == "start"]
    assert start.args["spec"]["secret_env"] == ["AUTH", "PLAIN", "WHOLE"]
    assert start.args["spec"]["secret_parts"] == [TOKEN]


async def test_a_multi_line_secret_is_warned_about_at_launch(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RD_PEM", PEM)
    await launch(tmp_path, monkeypatch, scripted_run(["hello"]), extra="      KEY: ${RD_PEM}\n")
    err = capsys.readouterr().err
    assert "warning: 1 secret value(s) of several lines" in err, err
    (record,) = [History().load(r["run_id"]) for r in History().list()]
    assert PEM.split("\n")[1] not in str(record)


async def test_logs_masks_a_secret_split_by_a_colour_code(tmp_path, monkeypatch, capsys):
    # masked in --no-tui, printed in clear by `logs`: its printer was given no secrets
    line = "key=%s\x1b[31m%s\x1b[0m end" % (WHOLE[:6], WHOLE[6:])
    await launch(tmp_path, monkeypatch, scripted_run([line]))
    assert "key=**** end" in capsys.readouterr().out
    t2 = scripted_run([line])
    monkeypatch.setattr(recorded_verbs, "make_transport", lambda *_a: t2)
    (run_id,) = [r["run_id"] for r in History().list()]
    code = await recorded_verbs.cmd_logs(argparse.Namespace(run_id=run_id, node=None, rank=None,
                                                            follow=False, by_node=False))
    out = capsys.readouterr().out
    assert code == 0 and "key=**** end" in out, out
    assert WHOLE[6:] not in out
