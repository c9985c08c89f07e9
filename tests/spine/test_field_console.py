"""A first launch as on a real cluster, from the console's side, with real torchrun on 2 local
nodes that each have a workdir of their own: the code goes there with `--sync`, a script
that is not on the hosts is refused before anything starts, and `rankdeck restart` from a new
shell (a RunController built from the run record) keeps the launch's `--env` values (the
record keeps their names; the restarting shell exports them, as it does secrets).

The script is a plain Python file outside the repository (no torch import): the run's time is
torchrun's start-up and one node's rejoin.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from console.records.history import History
from console.run.run import RunController
from console.launch.sync import build_manifest
from console.transport.local import LocalTransport

from tests.cli import rankdeck, runs_recorded
from tests.local_nodes import write_inventory
from tests.waits import wait_for

from .helpers import processes_of, wind_down

pytestmark = pytest.mark.e2e
RUN_TIMEOUT = 300
PROBE = textwrap.dedent("""\
    import os, time
    print("probe file=%s FOO=%s MODE=%s pid=%d" % (
        os.path.abspath(__file__), os.environ.get("FOO"), os.environ.get("MODE"), os.getpid()),
        flush=True)
    for _ in range(1200):  # until stopped
        time.sleep(0.5)
""")


def write_hosts(tmp_path) -> tuple[str, list[str]]:
    """Two local hosts, each with its own (empty) workdir, and a plain inventory env value."""
    workdirs = [str(tmp_path / ("host%d" % i) / "proj") for i in range(2)]
    return write_inventory(tmp_path, workdirs, 2, defaults="  env:\n    MODE: plain\n"), workdirs


def test_a_script_missing_on_the_hosts_is_refused_before_anything_starts(tmp_path):
    inv, workdirs = write_hosts(tmp_path)
    out = rankdeck("launch", "--no-tui", "-i", inv, "field_probe.py")
    assert out.returncode == 2, out
    assert "preflight found problems; nothing was started" in out.stderr
    for i, w in enumerate(workdirs):
        assert "node%d: script %s/field_probe.py is not on the host: use `rankdeck launch " \
            "--sync DIR`" % (i, w) in out.stderr
        assert not os.path.exists(os.path.join(w, ".rankdeck", "runs")), w
    assert runs_recorded() == []


async def test_synced_code_runs_and_a_restart_from_a_new_shell_keeps_env(tmp_path, monkeypatch):
    inv, workdirs = write_hosts(tmp_path)
    tree = tmp_path / "code"  # not in the repository, not under any workdir
    tree.mkdir()
    (tree / "field_probe.py").write_text(PROBE)
    (tree / ".gitignore").write_text("*.ckpt\n")
    (tree / "big.ckpt").write_text("ignored: never sent\n")
    out = rankdeck("launch", "--detach", "--no-tui", "-i", inv, "--sync", str(tree),
                   "--env", "FOO=bar-from-cli", "field_probe.py")
    assert out.returncode == 0, out
    run_id = out.stdout.strip().splitlines()[-1]
    assert "sync: node0 " in out.stderr and "done" in out.stderr  # the progress line
    for w in workdirs:  # each host's own copy, .gitignore obeyed
        assert sorted(os.listdir(w)) == [".gitignore", ".rankdeck", "field_probe.py"], w

    # a new shell: nothing of the launch's process, only the run record, and FOO exported
    # (the record keeps --env names only, docs/SECURITY.md: the restarting shell gives the
    # value again, as it does a secret's; refused without it: tests/unit/test_restart_env.py)
    monkeypatch.setenv("FOO", "bar-from-cli")
    ctl = RunController.from_record(History().load(run_id), LocalTransport(), History())
    try:
        lines: list[tuple[str, str]] = []
        ctl.state.line_listeners.append(
            lambda b: lines.extend((b.node, line) for line in b.lines if "probe " in line))
        assert await ctl.connect_all() == {}
        await ctl.subscribe_all()

        def probes(node):
            return [line for n, line in lines if n == node]
        await wait_for(lambda: probes("node0") and probes("node1"), RUN_TIMEOUT,
                       "both nodes' workers to print")
        for i, w in enumerate(workdirs):  # ran from the synced copy, with the --env value
            (line,) = probes("node%d" % i)
            assert "file=%s/field_probe.py FOO=bar-from-cli MODE=plain " % w in line, line

        record = History().load(run_id)
        assert record["sync"]["tree"] == build_manifest(str(tree), cache=False).tree
        assert record["sync"]["files"] == 2
        status = rankdeck("status", run_id, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["sync"]["tree"] == record["sync"]["tree"]

        results = await ctl.restart("node1")
        assert results["node1"]["launches"] == 2, results
        await wait_for(lambda: len(probes("node1")) >= 2, RUN_TIMEOUT,
                       "node1's restarted worker to print")
        again = probes("node1")[-1]
        assert again != probes("node1")[0]  # a new worker (pid)
        assert "file=%s/field_probe.py FOO=bar-from-cli MODE=plain " % workdirs[1] in again
    finally:
        left = await wind_down(ctl)
    assert not left, "processes left behind: %s" % left
    assert processes_of(run_id) == []
