"""Connecting to many hosts goes in waves (console/run/run.py ``CONNECT_AT_ONCE``): a thousand SSH
handshakes started at once on one laptop core would time the last ones out (docs/SCALE.md).
Real agents on four local nodes, at most two connecting at a time."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from console.records.history import History
from console.run.run import RunController
from console.transport.local import LocalTransport

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from spine.helpers import local_inventory  # noqa: E402

pytestmark = pytest.mark.e2e


class CountingTransport(LocalTransport):
    """The real local transport, counting the agent starts under way at once."""

    def __init__(self):
        super().__init__()
        self.now = 0
        self.most = 0

    async def open(self, host):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.2)  # hold the slot: a handshake takes time
            return await super().open(host)
        finally:
            self.now -= 1


async def test_hosts_connect_a_few_at_a_time_and_all_connect(tmp_path):
    transport = CountingTransport()
    ctl = RunController(local_inventory(tmp_path / "work", n=4), transport, History())
    ctl.connect_at_once = 2
    try:
        failed = await ctl.connect_all(reconnect=False)
        assert failed == {}
        assert sorted(ctl.connected()) == ["node0", "node1", "node2", "node3"]
        assert transport.most == 2, transport.most
    finally:
        await ctl.close()
