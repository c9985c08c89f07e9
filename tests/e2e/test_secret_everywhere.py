"""A secret printed by the trainer, on stdout and stderr and in the exception that ends it,
appears nowhere rankdeck writes on the laptop (issue 11); nor does one split by a colour
code, the token of a templated secret (``Bearer ${VAR}``) printed alone, or any line of a
secret of several lines (a PEM key) (issue 29).

One local node (real torchrun, a tiny script that imports nothing heavy), an inventory whose
``TOKEN``, ``AUTH`` and ``KEY`` take from the laptop's environment (so they are secret).
Every verb a user runs against the run: ``launch --no-tui --detach``, ``status``, ``status
--json``, ``logs``, ``stacks`` and ``stacks --json`` while it runs, ``attach --no-tui``
across its failure, the view (Textual Pilot, attached to the recorded run) with an SVG
screenshot of the failed run, then ``status``/``status --json``/``logs`` again with the
failure's cause. All their stdout and stderr, the screenshot, and every file under the
test's HOME and XDG state/cache folders (run history, status snapshots, the agent cache)
are searched for each of them.

Every verb after the launch runs in a shell WITHOUT the secrets' variables, so the console
cannot mask them: the host does (agent/rules/mask.py masks data before the journal).

In scope: everything on the laptop side, and on the host what rankdeck itself writes:
``state.json`` (its ``cause``), ``store.json``, the ``journal`` (what every verb reads).
Out of scope, by design (docs/SECURITY.md): torchrun's own copies of the trainer's output
on the host (its ``stdout.log``/``stderr.log``): the host had the secret in the trainer's
environment anyway. The test checks that the secret IS there, so it knows it was printed.
"""

from __future__ import annotations

import html
import json
import os
import secrets
import subprocess
import sys
import textwrap

import pytest

from console.records.history import History
from console.run.run import RunController
from console.transport.local import LocalTransport
from console.tui.app import RankdeckApp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
from spine.helpers import node_dir, processes_of  # noqa: E402
from tests.cli import console_env, rankdeck, start_rankdeck  # noqa: E402
from tests.waits import wait_for, wait_until  # noqa: E402

pytestmark = pytest.mark.e2e


def torchrun_logs(node_folder: str) -> list[str]:
    """The trainer's output as torchrun wrote it on the host (under the node's folder)."""
    return [os.path.join(root, name) for root, _dirs, names in os.walk(node_folder)
            for name in names if name in ("stdout.log", "stderr.log")]
TIMEOUT = 180
SCRIPT = textwrap.dedent("""\
    import os, sys, time
    tok = os.environ["TOKEN"]
    print("stdout has %s" % tok, flush=True)
    print("stderr has %s" % tok, file=sys.stderr, flush=True)
    print("coloured %s\\x1b[31m%s\\x1b[0m" % (tok[:6], tok[6:]), flush=True)
    print("bearer alone %s" % os.environ["AUTH"].split()[1], flush=True)
    print("key follows\\n%s" % os.environ["KEY"], flush=True)
    go = os.path.join(os.path.dirname(os.path.abspath(__file__)), "go")
    while not os.path.exists(go):  # up for stacks, attach and the view
        time.sleep(0.2)
    raise RuntimeError("credential rejected: %s" % tok)
""")


class Laptop:
    """The laptop's side of the test: the environment every command gets, and their output."""

    def __init__(self, tmp_path, secret: str, auth: str, pem: str):
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env = console_env(HOME=str(self.home), RANKDECK_TEST_TOKEN=secret,
                               RANKDECK_TEST_AUTH=auth, RANKDECK_TEST_PEM=pem)
        self.outputs: dict[str, str] = {}

    def run(self, *args: str, ok=(0,)) -> subprocess.CompletedProcess:
        out = rankdeck(*args, timeout=TIMEOUT, env=self.env)
        self.keep(" ".join(args), out.stdout, out.stderr)
        assert out.returncode in ok, (args, out.returncode, out.stdout, out.stderr)
        return out

    def keep(self, what: str, stdout: str, stderr: str) -> None:
        n = len(self.outputs)
        self.outputs["%d %s (stdout)" % (n, what)] = stdout
        self.outputs["%d %s (stderr)" % (n, what)] = stderr

    def files(self) -> dict[str, bytes]:
        """Every file rankdeck may have written on the laptop: HOME and the XDG folders."""
        found = {}
        for top in (str(self.home), os.environ["XDG_STATE_HOME"], os.environ["XDG_CACHE_HOME"]):
            for root, _dirs, names in os.walk(top):
                for name in names:
                    path = os.path.join(root, name)
                    if os.path.isfile(path) and not os.path.islink(path):
                        with open(path, "rb") as f:
                            found[path] = f.read()
        return found


def write_inventory(tmp_path) -> tuple[str, str]:
    """One local host; TOKEN, AUTH and KEY take from the laptop's environment, so they are
    secrets: AUTH in a template (``Bearer ${...}``), KEY of several lines (a PEM key)."""
    workdir = tmp_path / "proj"
    workdir.mkdir()
    (workdir / "leaky.py").write_text(SCRIPT)
    inv = tmp_path / "hosts.yaml"
    inv.write_text("transport: local\nhosts:\n  - name: node0\n    addr: 127.0.0.2\n"
                   "    workdir: %s\n    env:\n      TOKEN: ${RANKDECK_TEST_TOKEN}\n"
                   "      AUTH: \"Bearer ${RANKDECK_TEST_AUTH}\"\n"
                   "      KEY: ${RANKDECK_TEST_PEM}\n" % workdir)
    return str(inv), str(workdir)


def pem_key() -> str:
    body = secrets.token_urlsafe(48)
    return "-----BEGIN PRIVATE KEY-----\n%s\n%s\n-----END PRIVATE KEY-----\n" % (
        body[:32], body[32:])


def svg_text(svg: str) -> str:
    """The text of an SVG screenshot (entities decoded, no-break spaces as spaces)."""
    return html.unescape(svg).replace("\xa0", " ")


async def view_the_run(laptop: Laptop, run_id: str, workdir: str) -> None:
    """The TUI attached to the run (as `rankdeck attach` builds it) while the script fails;
    what it shows, its notifications and an SVG screenshot are kept."""
    ctl = RunController.from_record(History().load(run_id), LocalTransport(), History())
    assert await ctl.connect_all() == {}
    await ctl.recent_lines_only()
    app = RankdeckApp(ctl, ctl.subscribe_all)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: ctl.state.total_lines >= 2, TIMEOUT, "the lines")
            shown_running = app.export_screenshot()
            with open(os.path.join(workdir, "go"), "w"):
                pass
            await wait_until(pilot, lambda: ctl.state.nodes["node0"].state == "failed", TIMEOUT,
                             "the failure in the run's state")
            await wait_until(pilot, lambda: ctl.state.nodes["node0"].cause, TIMEOUT, "the cause")
            # the screen kept shows the failure: the nodes table redrawn with it, and painted
            await wait_until(pilot, lambda: (app.nodes.row_values("n:node0") or ("", ""))[1]
                             .startswith("failed"), TIMEOUT, "the failure in the nodes table")
            await pilot.pause()
            svg = app.export_screenshot()
            events = "\n".join(e.text for e in ctl.state.events)
            causes = "\n".join(n.cause or "" for n in ctl.state.nodes.values())
            laptop.keep("view", shown_running + svg, events + "\n" + causes)
            shown = svg_text(shown_running + svg)
            laptop.keep("view (svg text)", shown, "")
    finally:
        await ctl.close()
    assert "credential rejected" in causes, causes  # the cause path was exercised
    assert "stdout has ****" in shown, shown


async def test_a_secret_appears_nowhere_rankdeck_writes(tmp_path, monkeypatch):
    secret = "tok-" + secrets.token_hex(12)
    auth = "bearer-" + secrets.token_hex(12)  # printed alone, without the "Bearer " around it
    pem = pem_key()
    laptop = Laptop(tmp_path, secret, auth, pem)
    # each is searched for: the token, the bearer token alone, each long line of the key
    searched = [secret, auth] + pem.splitlines()
    inv, workdir = write_inventory(tmp_path)
    run_id = None
    try:
        out = laptop.run("launch", "--no-tui", "--detach", "-i", inv,
                         os.path.join(workdir, "leaky.py"))
        run_id = out.stdout.strip().splitlines()[-1]
        # every verb from here on runs in a shell without the secret's variable (another
        # terminal, another laptop): the console cannot mask what it does not know, so this
        # checks the hosts mask before anything leaves them (agent/rules/mask.py)
        for name in ("RANKDECK_TEST_TOKEN", "RANKDECK_TEST_AUTH", "RANKDECK_TEST_PEM"):
            del laptop.env[name]
            monkeypatch.delenv(name, raising=False)

        def printed() -> bool:
            return "stderr has" in laptop.run("logs", run_id).stdout
        await wait_for(printed, TIMEOUT, "the script's lines in `logs`", every=1.0)
        laptop.run("status", run_id)
        laptop.run("status", run_id, "--json")
        stacks = laptop.run("stacks", run_id, "--json")
        assert json.loads(stacks.stdout)["ranks"], stacks.stdout
        laptop.run("stacks", run_id)

        attach = start_rankdeck("attach", run_id, "--no-tui", env=laptop.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            await view_the_run(laptop, run_id, workdir)  # the script fails meanwhile
            stdout, stderr = attach.communicate(timeout=TIMEOUT)
        finally:
            if attach.poll() is None:
                attach.kill()
                attach.communicate()
        laptop.keep("attach --no-tui", stdout, stderr)
        assert "credential rejected" in stdout + stderr

        status = laptop.run("status", run_id, "--json")
        assert "credential rejected" in status.stdout  # the cause, masked
        laptop.run("status", run_id)
        laptop.run("logs", run_id)
    finally:
        if run_id is not None:
            laptop.run("stop", run_id, ok=(0, 1, 3))

    shown = "\n".join(laptop.outputs.values())
    assert "stdout has ****" in shown and "stderr has ****" in shown
    assert "coloured ****" in shown and "bearer alone ****" in shown
    assert "key follows" in shown  # then each of the key's lines, masked (`searched`)
    assert "secret value(s) of several lines" in shown  # the launch warned about KEY
    leaks = [(what, s[:8]) for what, text in laptop.outputs.items() for s in searched
             if s in text]
    assert leaks == [], "a secret in the output of: %s" % leaks
    files = laptop.files()
    assert any("rankdeck" in path for path in files), sorted(files)  # history was written
    leaks = [(path, s[:8]) for path, data in files.items() for s in searched
             if s.encode() in data]
    assert leaks == [], "a secret in laptop files: %s" % leaks

    host = node_dir(workdir, run_id, "node0")
    written = {name: os.path.join(host, name) for name in ("state.json", "journal")}
    written["store.json"] = os.path.join(os.path.dirname(host), "store.json")
    for name, path in written.items():  # the journal: masked on the host
        if os.path.exists(path) or name != "store.json":
            with open(path, "rb") as f:
                data = f.read()
            assert [s[:8] for s in searched if s.encode() in data] == [], name
    raw = "".join(open(p, errors="replace").read() for p in torchrun_logs(host))
    # out of scope: torchrun's own files, as the script printed them
    assert secret in raw and auth in raw and pem.splitlines()[1] in raw
    assert processes_of(run_id) == []
