"""A once-a-second sample of this host: CPU, memory, load, network, InfiniBand, the workdir's disk.

Standard library only, Python >= 3.8, Linux files only. ``HostSampler.sample()`` never
raises: a file or field this host does not have (no InfiniBand, a workdir on tmpfs or NFS, a
container without /sys) comes back as None ("n/a" in the views).

Rates (CPU %, Gbit/s, MB/s) are deltas of counters over the window since the sampler's last
reading, so a sampler's first reading has none. ``prime()`` takes that first reading (every
disk's too: which workdir will be asked for is not known yet), and the first ``sample()`` at
least ``FIRST_WINDOW_S`` later (``settle_s()``) has every rate: `serve` primes when it starts,
so a console that prints as soon as it has one sample (a new shell's `status`) has them too. A
reading closer than ``SHORTEST_WINDOW_S`` to the last one repeats that one's rates rather than
measure a window of a few CPU ticks.

Sample::

    {"ts": time.time(), "cpus": int|None, "cpu_pct": float|None (all cores, 0-100),
     "mem_used": int|None (bytes, MemTotal - MemAvailable), "mem_total": int|None,
     "load": [1 min, 5 min, 15 min] | None,
     "net": [{"iface": str, "up": bool|None, "rx_gbps": float|None, "tx_gbps": float|None}],
     "net_rx_gbps": float|None, "net_tx_gbps": float|None (sums over "net"),
     "ib": [{"port": "mlx5_0/1", "state": str|None, "up": bool|None,
             "rx_gbps": float|None, "tx_gbps": float|None}],
     "disk": {"dev": "nvme0n1", "read_mbs": float|None, "write_mbs": float|None} | None}

``net`` leaves out ``lo`` and bridges (a bridge's traffic is its members' traffic again).
``up`` is False only for a link this sampler saw up and that is down now: a healthy GPU host
has links down by design (``ifb0``, ``ifb1``, an unused port or HCA port), which are None,
as is a state the kernel does not know. A link down since before the sampler started (a new
``serve``) is not reported down; the supervisor's sampler lives as long as the run.
InfiniBand ``port_rcv_data``/``port_xmit_data`` count 4-byte words (IBTA PortCounters).
The disk is the block device holding the workdir, a partition mapped to its whole disk.
"""

import os
import time

from .gpu import GpuProbe

__all__ = ["HostSampler", "FIRST_WINDOW_S", "SHORTEST_WINDOW_S"]

FIRST_WINDOW_S = 0.25  # the primed window: /proc/stat counts 100 ticks a second per core
SHORTEST_WINDOW_S = 0.1  # a shorter window is mostly rounding (10 ms CPU ticks)
_SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own size
_IB_WORD = 4  # port_rcv_data / port_xmit_data are in units of 4 octets


def _read(path):
    """A small file's text, or None when it is not there or not readable."""
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return None


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _rate(new, old, dt, scale):
    """``(new - old) * scale / dt``; None without both counters or when one wrapped/reset."""
    if new is None or old is None or not dt or dt <= 0 or new < old:
        return None
    return round((new - old) * scale / dt, 6)


def _cpu_pct(new, old, _dt):
    """Busy share of all cores (0-100) between two ``(total, idle)`` tick counts."""
    total, idle = new[0] - old[0], new[1] - old[1]
    if total <= 0:  # no tick passed, or the counters went back
        return None
    return round(100.0 * max(0, total - idle) / total, 1)


def _sum(values):
    values = [v for v in values if v is not None]
    return round(sum(values), 6) if values else None


class HostSampler:
    """Takes host samples; keeps the previous counters for rates. One thread only.

    ``root``: where /proc and /sys are (a folder of fake files in tests).
    ``clock``: monotonic seconds, for the rates.
    """

    def __init__(self, root="/", clock=time.monotonic):
        self._root = root
        self._clock = clock
        self._prev = {}  # counter name -> (value, clock time, rate over the window it ended)
        self._disk_of = {}  # workdir -> block device name or None
        self._seen_up = set()  # links seen up: only those can go down
        self._primed_at = None

    def prime(self):
        """Take the first reading of every counter, so the next :meth:`sample` has rates."""
        self._primed_at = self._clock()
        self.sample()
        try:
            for dev, (read, written) in self._diskstats().items():
                self._delta("rd:" + dev, read, self._primed_at, _SECTOR / 1e6)
                self._delta("wr:" + dev, written, self._primed_at, _SECTOR / 1e6)
        except Exception:  # as in sample(): an odd file costs the disk rates, nothing else
            pass

    def settle_s(self):
        """Seconds until a sample's window since :meth:`prime` is ``FIRST_WINDOW_S`` long
        (0 when it is, or without a prime)."""
        if self._primed_at is None:
            return 0.0
        return max(0.0, self._primed_at + FIRST_WINDOW_S - self._clock())

    def _path(self, *parts):
        return os.path.join(self._root, *parts)

    def sample(self, workdir=None):
        """The host now (see the module docstring); ``workdir``: whose disk to measure."""
        now = self._clock()
        out = {"ts": time.time(), "cpus": os.cpu_count()}
        for part in (self._cpu, self._memory, self._load, self._net, self._ib):
            try:
                out.update(part(now))
            except Exception:  # a host's odd file must not cost the other figures
                continue
        try:
            out["disk"] = self._disk(now, workdir)
        except Exception:
            out["disk"] = None
        out.setdefault("cpu_pct", None)
        for key in ("mem_used", "mem_total", "load", "net_rx_gbps", "net_tx_gbps"):
            out.setdefault(key, None)
        out.setdefault("net", [])
        out.setdefault("ib", [])
        return out

    def _delta(self, name, value, now, scale):
        """Rate of counter ``name`` (times ``scale``) since the last reading."""
        return self._window(name, value, now, _rate, scale)

    def _window(self, name, value, now, rate_of, *args):
        """``rate_of(value, old value, seconds, *args)`` over the window since the last
        reading of ``name``, which then ends there; None at its first reading. Within
        ``SHORTEST_WINDOW_S`` of the last reading: that reading's rate, and its window goes on."""
        old = self._prev.get(name)
        if old is not None and now - old[1] < SHORTEST_WINDOW_S:
            return old[2]
        rate = None if old is None else rate_of(value, old[0], now - old[1], *args)
        self._prev[name] = (value, now, rate)
        return rate

    # -- CPU, memory, load -----------------------------------------------------------------
    def _cpu(self, now):
        text = _read(self._path("proc", "stat")) or ""
        fields = text.split("\n", 1)[0].split()
        if len(fields) < 5 or fields[0] != "cpu":
            return {"cpu_pct": None}
        ticks = [_int(v) or 0 for v in fields[1:9]]  # guest time is already in user time
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return {"cpu_pct": self._window("cpu", (sum(ticks), idle), now, _cpu_pct)}

    def _memory(self, _now):
        info = {}
        for line in (_read(self._path("proc", "meminfo")) or "").splitlines():
            key, _, rest = line.partition(":")
            words = rest.split()
            if words:
                info[key] = _int(words[0])
        total, avail = info.get("MemTotal"), info.get("MemAvailable")
        return {"mem_total": total * 1024 if total is not None else None,
                "mem_used": (total - avail) * 1024 if None not in (total, avail) else None}

    def _load(self, _now):
        words = (_read(self._path("proc", "loadavg")) or "").split()
        try:
            return {"load": [float(w) for w in words[:3]] if len(words) >= 3 else None}
        except ValueError:
            return {"load": None}

    # -- network ---------------------------------------------------------------------------
    def _net(self, now):
        text = _read(self._path("proc", "net", "dev"))
        if text is None:
            return {"net": []}
        ifaces = []
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            name, words = name.strip(), rest.split()
            if not name or name == "lo" or len(words) < 9 or self._is_bridge(name):
                continue
            rx, tx = _int(words[0]), _int(words[8])
            ifaces.append({"iface": name, "up": self._link_up(name, self._operstate_up(name)),
                           "rx_gbps": self._delta("rx:" + name, rx, now, 8e-9),
                           "tx_gbps": self._delta("tx:" + name, tx, now, 8e-9)})
        return {"net": ifaces, "net_rx_gbps": _sum(i["rx_gbps"] for i in ifaces),
                "net_tx_gbps": _sum(i["tx_gbps"] for i in ifaces)}

    def _link_up(self, link, up):
        """``up`` as a fault reads it: False only for a link seen up before (module docstring)."""
        if up:
            self._seen_up.add(link)
            return True
        return False if up is False and link in self._seen_up else None

    def _is_bridge(self, iface):
        return os.path.isdir(self._path("sys", "class", "net", iface, "bridge"))

    def _operstate_up(self, iface):
        state = _read(self._path("sys", "class", "net", iface, "operstate"))
        if state is None or state.strip() == "unknown":  # veth/tun often say unknown
            return None
        return state.strip() == "up"

    def _ib(self, now):
        base = self._path("sys", "class", "infiniband")
        try:
            devices = sorted(os.listdir(base))
        except OSError:
            return {"ib": []}
        ports = []
        for dev in devices:
            try:
                numbers = sorted(os.listdir(os.path.join(base, dev, "ports")))
            except OSError:
                continue
            for number in numbers:
                ports.append(self._ib_port(os.path.join(base, dev, "ports", number),
                                           "%s/%s" % (dev, number), now))
        return {"ib": ports}

    def _ib_port(self, path, name, now):
        state = _read(os.path.join(path, "state"))  # e.g. "4: ACTIVE"
        state = state.strip().split(":")[-1].strip() if state else None
        counters = os.path.join(path, "counters")
        rx = _int((_read(os.path.join(counters, "port_rcv_data")) or "").strip())
        tx = _int((_read(os.path.join(counters, "port_xmit_data")) or "").strip())
        up = self._link_up("ib:" + name, None if state is None else state == "ACTIVE")
        return {"port": name, "state": state, "up": up,
                "rx_gbps": self._delta("ibrx:" + name, rx, now, _IB_WORD * 8e-9),
                "tx_gbps": self._delta("ibtx:" + name, tx, now, _IB_WORD * 8e-9)}

    # -- the workdir's disk ----------------------------------------------------------------
    def _disk(self, now, workdir):
        if not workdir:
            return None
        if workdir not in self._disk_of:
            self._disk_of[workdir] = self._block_device(workdir)
        dev = self._disk_of[workdir]
        counters = self._diskstats().get(dev) if dev is not None else None
        if counters is None:
            return None
        return {"dev": dev,
                "read_mbs": self._delta("rd:" + dev, counters[0], now, _SECTOR / 1e6),
                "write_mbs": self._delta("wr:" + dev, counters[1], now, _SECTOR / 1e6)}

    def _diskstats(self):
        """``{device: (sectors read, sectors written)}`` from /proc/diskstats."""
        out = {}
        for line in (_read(self._path("proc", "diskstats")) or "").splitlines():
            words = line.split()
            if len(words) >= 10:
                out[words[2]] = (_int(words[5]), _int(words[9]))
        return out

    def _block_device(self, workdir):
        """The name (as in /proc/diskstats) of the disk holding ``workdir``, or None.

        None usually means the workdir is on a filesystem without a block device of its own
        (tmpfs, overlay, NFS: major number 0) or /sys is not mounted.
        """
        try:
            st_dev = os.stat(workdir).st_dev
        except OSError:
            return None
        if os.major(st_dev) == 0:
            return None
        link = self._path("sys", "dev", "block", "%d:%d" % (os.major(st_dev),
                                                            os.minor(st_dev)))
        real = os.path.realpath(link)
        if not os.path.isdir(real):
            return None
        if os.path.exists(os.path.join(real, "partition")):
            real = os.path.dirname(real)  # .../block/sda/sda1 -> .../block/sda
        return os.path.basename(real)


class TelemetryRecorder:
    """Journals the node's telemetry every ``every`` seconds (``k: telemetry`` records), so
    ``attach``, ``export`` and ``report`` replay it like metrics. The live view's once-a-second
    figures come from ``serve`` instead; this is the run's history at a coarser step (about
    1-3 KB a record: 10-25 MB a day at 10 s)."""

    def __init__(self, journal, workdir, every=10.0, clock=time.monotonic):
        self._journal = journal
        self._workdir = workdir
        self._every = every
        self._clock = clock
        self._next = None
        self._host = HostSampler(clock=clock)
        self._gpu = GpuProbe()
        self._ecc = {}  # gpu index -> uncorrectable ECC errors reported so far (gpu_errors)
        self.errors = []  # the texts of those errors, this run's (the host's record: fleet.py)

    def tick(self):
        """Called from the supervisor's loop; records when a period has passed."""
        now = self._clock()
        if self._next is None:  # the first sample only primes the rates
            self._host.sample(self._workdir)
            self._next = now + self._every
            return
        if now < self._next:
            return
        self._next = now + self._every
        gpu = self._gpu.snapshot()
        self._journal.append({"k": "telemetry", "ts": time.time(),
                              "host": self._host.sample(self._workdir), "gpu": gpu})
        for index, error in gpu_errors(gpu, self._ecc):
            # an event, which the node's link forwards: the judge proposes the node for
            # cordon (agent/rules/judge.py gpu_proposal)
            self._journal.append({"k": "event", "what": "gpu_error", "ts": time.time(),
                                  "gpu": index, "error": error,
                                  "text": "GPU %s reported %s" % (index, error)})
            if len(self.errors) < 8:
                self.errors.append("GPU %s reported %s" % (index, error))


def gpu_errors(snap, ecc):
    """``[(gpu index, "Xid 79" | "2 uncorrectable ECC error(s)")]`` new in ``snap`` (a
    GpuProbe snapshot): its Xid events (each reported once by the probe) and a rise of a GPU's
    volatile uncorrectable ECC count over ``ecc`` ({index: count}, updated; a count already
    there at the first snapshot counts as new: the GPU has had them since the driver loaded)."""
    out = []
    for gpu in snap.get("gpus") or []:
        index = gpu.get("index")
        for entry in gpu.get("xid") or []:
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], int):
                out.append((index, "Xid %d" % entry[1]))
        count = gpu.get("ecc_uncorrected")
        if isinstance(count, int) and count > ecc.get(index, 0):
            out.append((index, "%d uncorrectable ECC error(s)" % (count - ecc.get(index, 0))))
            ecc[index] = count
    return out
