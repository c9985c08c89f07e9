"""A real writer on a real agent (local transport): a secret written in two pieces never
reaches `--no-tui` output, the kept lines or the run's history record."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from console.verbs.headless import run_headless
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.local import LocalTransport
from inventory.model import EnvValue, Host, Inventory

pytestmark = pytest.mark.e2e
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mask_writer.py")
SECRET = "S3cr3t-Value-Zq9!"


def test_a_secret_written_in_pieces_is_masked_on_screen_and_on_disk(tmp_path, capsys):
    host = Host(name="node0", addr="127.0.0.2", python="", workdir=str(tmp_path),
                env={"API_TOKEN": EnvValue(SECRET, True)})
    inventory = Inventory(path="<test>", hosts=[host], transport="local")
    history = History(str(tmp_path / "history"))
    spec = LaunchSpec(script=WRITER, launcher=[sys.executable], max_restarts=0)

    async def main():
        async with RunController(inventory, LocalTransport(), history) as ctl:
            code = await asyncio.wait_for(
                run_headless(ctl, lambda: ctl.launch(spec, preflight=False)), 120)
            await ctl.leave()  # as the verb does: the status saved in the record
            return code, [line for rs in ctl.state.ranks.values() for line in rs.lines]

    code, kept = asyncio.run(main())
    out = capsys.readouterr()
    assert code == 0, out
    shown = out.out + out.err
    assert "step 1 key=**** done" in shown and "finished" in shown, shown[-2000:]
    # masked where it stood: the 64 KiB line comes in pieces, and where the console cuts
    # it depends on where the host cut it (never inside the secret: agent/host/tail.py)
    assert "**** tail" in "".join(kept)
    for fragment in (SECRET[:6], SECRET[6:], SECRET[:10], SECRET[10:]):
        assert fragment not in shown
        assert not any(fragment in line for line in kept)
    for name in os.listdir(history.folder):
        with open(os.path.join(history.folder, name)) as f:
            assert SECRET[10:] not in f.read()
