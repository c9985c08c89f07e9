"""The view's hosts screen (``H``, console/tui/hosts.py): the run's hosts asked through its own
links (real agents, the local transport), a flagged host (its record: agent/host/fleet.py's
writer) marked FLAGGED with its incidents, and marked in the nodes table; the key is in the
help."""

from __future__ import annotations

import os

from agent.host import fleet
from agent.rules import fleet as rules
from console.records.history import History
from console.run.run import RunController
from console.transport.local import LocalTransport
from console.tui.app import RankdeckApp
from console.tui.help import HelpScreen
from console.tui.hosts import HostsScreen
from console.tui.nodes import FLAG_MARK
from tests.console.test_tui import help_rows
from tests.local_nodes import local_inventory
from tests.waits import wait_until


async def test_h_shows_the_hosts_and_marks_the_flagged_one(tmp_path):
    work = [str(tmp_path / "w0"), str(tmp_path / "w1")]
    for i in (1, 2):
        ndir = os.path.join(work[1], ".rankdeck", "runs", "old%d" % i, "node1")
        os.makedirs(ndir)
        fleet.note_end(ndir, "old%d" % i, "node1", "failed",
                       [rules.incident("crashed", "rank 1: CUDA error %d" % i)], ended=10.0 + i)
    ctl = RunController(local_inventory(work, n=2), LocalTransport(), History())
    try:
        assert not await ctl.connect_all(reconnect=False)
        app = RankdeckApp(ctl)
        async with app.run_test(size=(160, 48)) as pilot:
            await pilot.press("question_mark")
            await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
            rows = help_rows(app.screen)
            assert "H" in rows["Hosts: load, GPU memory, strays, incidents"], rows
            await pilot.press("escape")
            await pilot.press("H")
            await wait_until(pilot, lambda: isinstance(app.screen, HostsScreen)
                             and app.screen.rows is not None, what="the hosts answered",
                             timeout=60)
            rows = {r["name"]: r for r in app.screen.rows}
            assert rows["node1"]["flagged"] and not rows["node0"]["flagged"]
            body = str(app.screen.query_one("#hosts-body").content)
            assert "node1" in body and "FLAGGED" in body and "CUDA error 2" in body, body
            # the nodes table marks the flagged host, and only it
            await pilot.press("escape")
            assert app.nodes.row_values("n:node1")[0].endswith("node1" + FLAG_MARK)
            assert app.nodes.row_values("n:node0")[0].endswith("node0")
    finally:
        await ctl.close()
