"""HostSampler: host figures from /proc and /sys, rates from deltas, n/a never a crash.

Fake /proc and /sys trees give figures of known rate (the real ones change under the test);
one test reads this machine's real files for the shape of the answer.
"""

import json
import os
import subprocess
import sys
import threading

from agent.serve import server as serve
from agent.host.stats import FIRST_WINDOW_S, HostSampler
from agent.host.journal import JournalWriter
from console.model.telemetry import node_telemetry
from tests.waits import wait_for_sync

NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: {lo} 10 0 0 0 0 0 0 {lo} 10 0 0 0 0 0 0
  eth0: {rx} 100 0 0 0 0 0 0 {tx} 100 0 0 0 0 0 0
docker0: {rx} 100 0 0 0 0 0 0 {tx} 100 0 0 0 0 0 0
"""


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def fake_host(root, tick=0, with_ib=True, disk_of=None):
    """A host whose counters advance by known amounts per ``tick`` (one second each)."""
    # cpu: 100 ticks a second, 25 of them busy (user), 75 idle
    write(root, "proc/stat", "cpu  %d 0 0 %d 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n"
          % (1000 + 25 * tick, 5000 + 75 * tick))
    write(root, "proc/meminfo", "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n"
          "MemAvailable:   12000000 kB\n")
    write(root, "proc/loadavg", "1.50 0.75 0.25 2/345 6789\n")
    # eth0: 1.25e9 bytes/s in (10 Gbit/s), 0.25e9 out (2 Gbit/s); lo moves but is left out
    write(root, "proc/net/dev", NET_DEV.format(lo=10 ** 9 * tick, rx=1250 * 10 ** 6 * tick,
                                               tx=250 * 10 ** 6 * tick))
    write(root, "sys/class/net/eth0/operstate", "up\n")
    (root / "sys/class/net/docker0/bridge").mkdir(parents=True, exist_ok=True)
    if with_ib:
        port = "sys/class/infiniband/mlx5_0/ports/1/"
        write(root, port + "state", "4: ACTIVE\n")
        # 100 Gbit/s in: 12.5e9 bytes/s = 3.125e9 four-byte words
        write(root, port + "counters/port_rcv_data", "%d\n" % (3125 * 10 ** 6 * tick))
        write(root, port + "counters/port_xmit_data", "%d\n" % (625 * 10 ** 6 * tick))
    if disk_of is not None:
        major, minor = os.major(disk_of), os.minor(disk_of)
        # 256 MB/s read (500000 sectors), 64 MB/s written on the whole disk "sdz"
        write(root, "proc/diskstats",
              " %d 0 sdz 1 0 %d 0 1 0 %d 0 0 0 0\n %d %d sdz1 1 0 5 0 1 0 5 0 0 0 0\n"
              % (major, 500000 * tick, 125000 * tick, major, minor))
        block = root / "sys/devices/pci0/block/sdz/sdz1"
        block.mkdir(parents=True, exist_ok=True)
        (block / "partition").write_text("1\n")
        link = root / ("sys/dev/block/%d:%d" % (major, minor))
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(block)


def sampler_on_fake_host(tmp_path):
    """A sampler of a fake host at tick 0 whose disk is the one a workdir in ``tmp_path`` is
    on: (clock, workdir, its st_dev, sampler)."""
    clock = FakeClock()
    workdir = tmp_path / "work"
    workdir.mkdir()
    st_dev = os.stat(workdir).st_dev
    fake_host(tmp_path / "h", 0, disk_of=st_dev)
    return clock, workdir, st_dev, HostSampler(root=str(tmp_path / "h"), clock=clock)


def test_rates_from_two_samples(tmp_path):
    clock, workdir, st_dev, sampler = sampler_on_fake_host(tmp_path)

    first = sampler.sample(str(workdir))
    assert first["cpu_pct"] is None  # rates need two samples
    assert first["net"] == [{"iface": "eth0", "up": True, "rx_gbps": None, "tx_gbps": None}]
    assert first["mem_total"] == 16000000 * 1024
    assert first["mem_used"] == 4000000 * 1024
    assert first["load"] == [1.5, 0.75, 0.25]

    clock.now += 2.0
    fake_host(tmp_path / "h", 2, disk_of=st_dev)
    snap = sampler.sample(str(workdir))
    assert snap["cpu_pct"] == 25.0
    assert snap["net"] == [{"iface": "eth0", "up": True, "rx_gbps": 10.0, "tx_gbps": 2.0}]
    assert (snap["net_rx_gbps"], snap["net_tx_gbps"]) == (10.0, 2.0)
    assert snap["ib"] == [{"port": "mlx5_0/1", "state": "ACTIVE", "up": True,
                           "rx_gbps": 100.0, "tx_gbps": 20.0}]
    if os.major(st_dev):  # a workdir on tmpfs/overlay has no block device to map
        assert snap["disk"] == {"dev": "sdz", "read_mbs": 256.0, "write_mbs": 64.0}


def test_a_primed_sampler_has_every_rate_in_its_first_sample(tmp_path):
    """serve primes at start: the first message a new shell's `status` gets has rates, the
    workdir's disk too although nobody had asked for that disk at the prime."""
    clock, workdir, st_dev, sampler = sampler_on_fake_host(tmp_path)
    assert sampler.settle_s() == 0.0  # nothing primed: nothing to wait for

    sampler.prime()
    assert sampler.settle_s() == FIRST_WINDOW_S
    clock.now += 1.0
    assert sampler.settle_s() == 0.0
    fake_host(tmp_path / "h", 1, disk_of=st_dev)
    first = sampler.sample(str(workdir))
    assert first["cpu_pct"] == 25.0
    assert (first["net_rx_gbps"], first["net_tx_gbps"]) == (10.0, 2.0)
    assert [(p["rx_gbps"], p["tx_gbps"]) for p in first["ib"]] == [(100.0, 20.0)]
    if os.major(st_dev):
        assert first["disk"] == {"dev": "sdz", "read_mbs": 256.0, "write_mbs": 64.0}


def test_a_sample_too_soon_after_the_last_repeats_its_rates(tmp_path):
    """A second message right after the last (a new subscription's) measures no window of a
    few CPU ticks; the window it did not close goes on to the next sample."""
    clock = FakeClock()
    root = tmp_path / "h"
    fake_host(root, 0)
    sampler = HostSampler(root=str(root), clock=clock)
    sampler.prime()
    clock.now += 1.0
    fake_host(root, 1)
    assert sampler.sample()["net_rx_gbps"] == 10.0

    clock.now += 0.05
    write(root, "proc/stat", "cpu  1030 0 0 5075 0 0 0 0 0 0\n")  # 5 more ticks, all busy
    # 4 s of traffic at tick 1's pace in 0.05 s
    write(root, "proc/net/dev", NET_DEV.format(lo=0, rx=1250 * 10 ** 6 * 5,
                                               tx=250 * 10 ** 6 * 5))
    soon = sampler.sample()
    assert (soon["cpu_pct"], soon["net_rx_gbps"], soon["net_tx_gbps"]) == (25.0, 10.0, 2.0)

    clock.now += 0.95  # 1 s after the window's start: the traffic of 4 s came in it
    later = sampler.sample()
    assert (later["net_rx_gbps"], later["net_tx_gbps"]) == (40.0, 8.0)
    assert later["cpu_pct"] == 100.0


def test_missing_files_are_none_not_a_crash(tmp_path):
    (tmp_path / "empty").mkdir()
    sampler = HostSampler(root=str(tmp_path / "empty"))
    for _ in range(2):
        snap = sampler.sample(str(tmp_path / "no-such-workdir"))
        assert {k: snap[k] for k in ("cpu_pct", "mem_used", "mem_total", "load", "net",
                                     "net_rx_gbps", "net_tx_gbps", "ib", "disk")} == {
            "cpu_pct": None, "mem_used": None, "mem_total": None, "load": None, "net": [],
            "net_rx_gbps": None, "net_tx_gbps": None, "ib": [], "disk": None}


def test_garbage_and_counter_reset_give_none(tmp_path):
    clock = FakeClock()
    root = tmp_path / "h"
    fake_host(root, 5, with_ib=True)
    sampler = HostSampler(root=str(root), clock=clock)
    sampler.sample()
    clock.now += 1
    fake_host(root, 1)  # counters went backwards (a driver reload, a wrap)
    write(root, "proc/loadavg", "not numbers at all\n")
    write(root, "proc/meminfo", "MemTotal: lots\n")
    write(root, "sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n")
    snap = sampler.sample()
    assert snap["net"][0]["rx_gbps"] is None and snap["cpu_pct"] is None
    assert snap["load"] is None and snap["mem_total"] is None
    assert snap["ib"][0]["up"] is False and snap["ib"][0]["rx_gbps"] is None


def test_real_host_answers_every_field():
    sampler = HostSampler()
    sampler.sample("/")

    def second() -> dict | None:  # rates need the CPU counters to have moved since the first
        snap = sampler.sample("/")
        return snap if snap["cpu_pct"] is not None else None
    snap = wait_for_sync(second, 30, "a sample after the CPU counters moved")
    assert snap["cpus"] >= 1 and 0.0 <= snap["cpu_pct"] <= 100.0
    assert 0 < snap["mem_used"] < snap["mem_total"]
    assert len(snap["load"]) == 3
    assert all(i["iface"] != "lo" for i in snap["net"])
    assert all(i["rx_gbps"] is not None for i in snap["net"])


def test_serve_sends_host_sample_with_gpu_snapshot():
    """The agent's once-a-second ``gpu`` message carries the host sample beside the GPUs,
    with rates from the first message on (serve primes its sampler when it starts)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "agent", "serve"], cwd=repo,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        msgs = [json.loads(proc.stdout.readline()) for _ in range(3)]  # hello, 2 samples
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    gpu = [m for m in msgs if m["t"] == "gpu"]
    assert len(gpu) == 2 and "snap" in gpu[0]
    assert gpu[0]["host"]["mem_total"] > 0
    for msg in gpu:
        assert 0.0 <= msg["host"]["cpu_pct"] <= 100.0
        assert all(i["rx_gbps"] is not None for i in msg["host"]["net"])


def test_only_a_link_that_was_up_and_went_down_is_down(tmp_path):
    """ifb0/ifb1 (down by design on a healthy GPU host, issue 29) and an unused port are never
    reported down; eth1 is, once it was up and lost its link. The same for InfiniBand ports."""
    clock = FakeClock()
    root = tmp_path / "h"
    fake_host(root, 0)
    dev = NET_DEV.format(lo=0, rx=0, tx=0) + "".join(
        "%6s: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n" % name for name in ("ifb0", "ifb1", "eth1"))
    write(root, "proc/net/dev", dev)
    for name, state in (("ifb0", "down"), ("ifb1", "down"), ("eth1", "up")):
        write(root, "sys/class/net/%s/operstate" % name, state + "\n")
    unused = "sys/class/infiniband/mlx5_1/ports/1/"
    write(root, unused + "state", "1: DOWN\n")
    sampler = HostSampler(root=str(root), clock=clock)

    def down(snap):
        return node_telemetry(None, snap)["links_down"]
    assert down(sampler.sample()) == []  # a healthy host
    clock.now += 1
    write(root, "sys/class/net/eth1/operstate", "down\n")
    write(root, "sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n")
    snap = sampler.sample()
    assert down(snap) == ["eth1", "mlx5_0/1"]
    assert [i["up"] for i in snap["net"] if i["iface"].startswith("ifb")] == [None, None]
    clock.now += 1
    write(root, "sys/class/net/eth1/operstate", "up\n")  # back: not down any more
    assert down(sampler.sample()) == ["mlx5_0/1"]


class Messages:
    """serve's output as messages, and a wait for the first of a kind."""

    def __init__(self):
        self.msgs = []
        self.cond = threading.Condition()

    def write(self, data):
        with self.cond:
            self.msgs += [json.loads(line) for line in data.splitlines()]
            self.cond.notify_all()

    def flush(self):
        pass

    def wait_for(self, kind, after=0):
        """The index of the first ``kind`` message from index ``after`` on."""
        def found():
            return next((i for i, m in enumerate(self.msgs) if i >= after and m["t"] == kind),
                        None)
        with self.cond:
            assert self.cond.wait_for(lambda: found() is not None, 30), self.msgs
            return found()


def test_a_new_subscriptions_state_comes_after_a_sample_of_its_disk(tmp_path, monkeypatch):
    """A console prints `status` once a node's state arrives: the host sample before it must
    have the rates of the run folder's disk too, not only a sample from before the
    subscription named that folder (the next comes a second later)."""
    ndir = tmp_path / "node1"
    ndir.mkdir()
    (ndir / "state.json").write_text('{"state": "exited"}')
    JournalWriter(str(ndir / "journal")).append({"k": "event", "what": "launched"})
    monkeypatch.setattr(serve.node, "node_dir", lambda args: str(ndir))
    out = Messages()
    server = serve.Server(out=out)
    loop = threading.Thread(target=server.streams.stream_loop, daemon=True)
    loop.start()
    try:
        first = out.wait_for("gpu")  # before any subscription: no disk to measure
        assert out.msgs[first]["host"]["disk"] is None
        assert out.msgs[first]["host"]["cpu_pct"] is not None
        server.op_subscribe({"node": "node1"})
        state = out.wait_for("state", first)
    finally:
        server.closed.set()
        server.streams.turn_now()
        loop.join(30)
    before = [m for m in out.msgs[:state] if m["t"] == "gpu"][-1]["host"]
    assert before["cpu_pct"] is not None
    assert before["net_rx_gbps"] is not None or not before["net"]
    if HostSampler().sample(str(ndir))["disk"] is not None:  # a workdir on a block device
        disk = before["disk"] or {}
        assert None not in (disk.get("read_mbs"), disk.get("write_mbs")), before["disk"]
