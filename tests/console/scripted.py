"""A scripted agent transport: a fake of every node's agent that replays a scripted run.

``ScriptedTransport.open(host)`` returns an AgentStream that speaks agent/wire/protocol.py: it
sends a hello, answers requests (store_start, start, subscribe, stop, restart, state,
scrollback...) and, once subscribed, pushes the node's scripted journal, supervisor state
and GPU snapshot. Every request is recorded in ``transport.requests`` so tests can assert
that a kill sent ``stop`` to the right node. Tests (and bench/tui.py) push more records live
with ``transport.node(name).append(recs)``.

``RunScript`` builds journals of a plausible torchrun run: file records per rank, log lines,
metrics, checkpoints, a crash. Every timestamp is fixed, so screenshots are repeatable.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

from agent.wire import protocol
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.base import AgentStream, HostUnreachable, Transport
from inventory.model import Inventory
from tests.local_nodes import local_inventory

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
RUN_ID = "20231114-221320-beef"


@dataclass
class Request:
    node: str
    op: str
    args: dict


class ScriptedStream(AgentStream):
    def __init__(self, transport: "ScriptedTransport", node: "ScriptedNode"):
        self.transport = transport
        self.node = node
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def send(self, msg: dict) -> None:
        self.send_raw(protocol.encode(msg))

    def send_raw(self, data: bytes) -> None:
        if not self.closed:
            self.queue.put_nowait(data)

    async def readline(self) -> bytes:
        if self.closed and self.queue.empty():
            return b""
        return await self.queue.get()

    def write(self, data: bytes) -> None:
        for line in data.splitlines():
            if line.strip():
                self.transport.handle(self, protocol.decode(line))

    async def drain(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(b"")
        if self.node.stream is self:
            self.node.stream = None
            self.node.subscribed = False


@dataclass
class ScriptedNode:
    """The agent side of one node: its journal so far, supervisor state and GPU snapshot."""

    name: str
    journal: list = field(default_factory=list)  # [(end_offset, recs)]
    end: int = 0
    state: dict = field(default_factory=lambda: {"state": "running", "restarts": 0,
                                                 "launches": 1, "max_restarts": 3})
    gpu: dict | None = None
    host: dict | None = None  # the host sample sent with the GPU snapshot
    stream: ScriptedStream | None = None
    subscribed: bool = False
    launches: int = 0

    def append(self, recs: list) -> None:
        """Add records to the journal; pushed at once when a console is subscribed.

        A record takes 100 bytes plus its data in this journal; each record's meta gets its start
        offset ``j``, as the real agent's reader adds it (agent/host/journal.py).
        """
        placed = []
        for rec in recs:
            rec = [dict(rec[0], j=self.end)] + list(rec[1:])
            placed.append(rec)
            self.end += 100 + (len(rec[1]) if len(rec) > 1 else 0)
        recs = placed
        self.journal.append((self.end, recs))
        if self.subscribed and self.stream is not None:
            self.stream.send({"t": "journal", "sub": self.name, "end": self.end, "recs": recs})

    def set_state(self, state: dict) -> None:
        self.state = state
        if self.subscribed and self.stream is not None:
            self.stream.send({"t": "state", "sub": self.name, "state": state})

    def set_gpu(self, snap: dict) -> None:
        self.gpu = snap
        if self.subscribed and self.stream is not None:
            self.stream.send({"t": "gpu", "snap": snap})

    def scrollback(self, files: set, before: int, want: int) -> dict:
        """The ``scrollback`` op: data records of ``files`` starting before ``before``, newest
        first until ``want`` bytes; ``start`` is the oldest one's offset (0 at the start)."""
        older = [rec for _end, recs in self.journal for rec in recs
                 if rec[0].get("k") == "data" and rec[0]["j"] < before]
        out, got, start = [], 0, 0
        for rec in reversed(older):
            if got >= want:
                start = out[0][0]["j"]
                break
            if rec[0].get("f") in files:
                out.insert(0, rec)
                got += len(rec[1])
        return {"recs": out, "start": start}

    def replay(self, offset: int, quiet_until: int = 0) -> None:
        """Send the journal from ``offset``; log data of records starting before ``quiet_until``
        is left out (as the agent does for a console that asked for recent lines only)."""
        for end, recs in self.journal:
            if end > offset:
                recs = [r for r in recs if r[0].get("k") != "data" or r[0]["j"] >= quiet_until]
                self.stream.send({"t": "journal", "sub": self.name, "end": end, "recs": recs})
        self.stream.send({"t": "state", "sub": self.name, "state": self.state})
        if self.gpu is not None:
            self.stream.send({"t": "gpu", "snap": self.gpu, "host": self.host})


class ScriptedTransport(Transport):
    """Fake agents for every host. ``unreachable``: {host: (cause, message)} refuses open;
    ``hold``: ops whose answers wait until :meth:`release` (to look at launch progress);
    ``refuse``: {(op, host): message} answered as the agent's error."""

    def __init__(self, nodes: dict[str, ScriptedNode] | None = None,
                 unreachable: dict | None = None, hold=(), facts: dict | None = None,
                 refuse: dict | None = None):
        self.nodes: dict[str, ScriptedNode] = dict(nodes or {})
        self.unreachable = dict(unreachable or {})
        self.refuse = dict(refuse or {})
        self.facts = dict(facts or {})  # {host: preflight facts to add/override}
        self.hold = set(hold)
        self.requests: list[Request] = []
        self._released = asyncio.Event()
        self.opened: list[str] = []

    def node(self, name: str) -> ScriptedNode:
        if name not in self.nodes:
            self.nodes[name] = ScriptedNode(name)
        return self.nodes[name]

    def ops(self, op: str) -> list[str]:
        """The nodes that received ``op``, in order."""
        return [r.node for r in self.requests if r.op == op]

    def release(self) -> None:
        self._released.set()

    async def open(self, host) -> AgentStream:
        await asyncio.sleep(0)
        if "open" in self.hold:
            await self._released.wait()
        if host.name in self.unreachable:
            cause, message = self.unreachable[host.name]
            raise HostUnreachable(cause, message)
        node = self.node(host.name)
        stream = ScriptedStream(self, node)
        node.stream = stream
        self.opened.append(host.name)
        stream.send({"t": "hello", "proto": protocol.PROTOCOL_VERSION, "agent": "scripted",
                     "host": host.name, "python": "3.11.7", "pid": 1})
        return stream

    def handle(self, stream: ScriptedStream, msg: dict) -> None:
        if msg.get("t") != "req":
            return
        node = stream.node
        req = Request(node.name, msg["op"], msg.get("args") or {})
        self.requests.append(req)
        if req.op in self.hold and not self._released.is_set():
            async def later():
                await self._released.wait()
                self._answer(stream, msg["id"], req)
            asyncio.ensure_future(later())
        else:
            self._answer(stream, msg["id"], req)

    def _answer(self, stream: ScriptedStream, req_id: int, req: Request) -> None:
        node = stream.node
        refused = self.refuse.get((req.op, node.name))
        if refused is not None:
            stream.send({"t": "res", "id": req_id, "ok": False, "error": refused,
                         "kind": "error"})
            return
        data: dict = {}
        if req.op == "ping":
            data = {"time": time.time()}
        elif req.op == "hello":  # who the console is (agent/serve/server.py op_hello)
            data = {"login": "tester", "role": req.args.get("role", "drive")}
        elif req.op == "preflight":
            data = dict(preflight_facts(node.name, req.args.get("workdir", "/tmp")),
                        **self.facts.get(node.name, {}))
        elif req.op == "listen":
            data = {"port": 29399}
        elif req.op == "probe_tcp":
            data = {"ok": True, "ms": 0.4}
        elif req.op in ("store_start", "store_wait"):
            data = {"port": 29400, "pid": 4242}
        elif req.op == "start":
            node.launches += 1
            data = dict(node.state, launches=node.launches, pid=1000)
        elif req.op == "subscribe":
            offset = int(req.args.get("offset", 0))
            stream.send({"t": "res", "id": req_id, "ok": True,
                         "data": {"sub": node.name, "offset": offset}})
            node.stream, node.subscribed = stream, True
            node.replay(offset, int(req.args.get("quiet_until", 0)))
            return
        elif req.op == "stop":
            node.append([[event("stopping", T0 + 500)],
                          [event("ended", T0 + 501, state="stopped", exit_code=-15)]])
            node.set_state({"state": "stopped", "exit_code": -15, "restarts": 0})
            data = {"state": "stopped", "kill": {"sigterm": [1000, 1001], "killed": []},
                    "left": []}
        elif req.op == "restart":
            node.launches += 1
            node.append([[event("restarting", T0 + 600)],
                          [event("launched", T0 + 601, pid=2000, launch=node.launches)]])
            data = {"state": "running", "launches": node.launches, "restarts": 1}
        elif req.op == "state":
            data = dict(node.state, journal_size=node.end)
        elif req.op == "scrollback":
            data = node.scrollback(set(req.args["files"]), int(req.args["before"]),
                                   int(req.args.get("bytes", 256 * 1024)))  # since: a hint
        elif req.op not in ("unsubscribe", "store_stop", "sync_check", "stacks", "why"):
            # as agent/serve/server.py answers an op it does not have (this agent has no judge)
            stream.send({"t": "res", "id": req_id, "ok": False, "kind": "usage",
                         "error": "unknown request %r (agent scripted)" % req.op})
            return
        stream.send({"t": "res", "id": req_id, "ok": True, "data": data})


# -- building scripted runs ---------------------------------------------------------------
def preflight_facts(node: str, workdir: str) -> dict:
    """What a healthy host's agent reports to the preflight."""
    return {"hostname": node, "hostname_resolves": "127.0.0.1", "time": time.time(),
            "agent_python": "3.11.7", "workdir": workdir, "workdir_exists": True,
            "disk_free": 500 * 2 ** 30, "gpu_source": "nvml", "gpu_reason": None,
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "mem_free": 79 * 2 ** 30}
                     for i in range(2)],
            "python": "3.11.7", "executable": "/usr/bin/python3", "torch": "2.13.0",
            "cuda": "12.8", "cuda_available": True, "cuda_devices": 2, "nccl": "2.27.3",
            "time_after": time.time()}


def event(what: str, ts: float, **extra) -> dict:
    return dict({"k": "event", "what": what, "ts": ts}, **extra)


def gpu_snapshot(count: int, util: int = 87, name: str = "NVIDIA H100 80GB HBM3") -> dict:
    gib = 2 ** 30
    return {"source": "nvml", "reason": None, "ts": T0, "gpus": [
        {"index": i, "name": name, "uuid": "GPU-%d" % i, "util": util - 3 * i,
         "mem_used": (41 + i) * gib, "mem_total": 80 * gib, "temp": 61 + i,
         "power": 402.0 + 5 * i, "power_limit": 700.0, "pids": [1000 + i],
         "pid_mem": [[1000 + i, (40 + i) * gib]]} for i in range(count)]}


def host_sample(cpu: float = 63.0) -> dict:
    """A host sample as the agent sends one (agent/host/stats.py): CPU, memory, load,
    network, InfiniBand and the workdir's disk."""
    return {"cpu_pct": cpu, "mem_used": 412.3 * 2 ** 30, "mem_total": 2015.6 * 2 ** 30,
            "load": [38.2, 37.9, 37.5], "net_rx_gbps": 1.2, "net_tx_gbps": 0.9,
            "ib": [{"port": "mlx5_0/1", "state": "ACTIVE", "up": True, "rx_gbps": 182.0,
                    "tx_gbps": 181.0}],
            "disk": {"dev": "nvme0n1", "read_mbs": 12.0, "write_mbs": 310.0}}


def no_gpu_snapshot(reason: str = "no GPUs (pynvml: NVML Shared Library Not Found; "
                                  "nvidia-smi: not found)") -> dict:
    return {"source": "none", "reason": reason, "ts": T0, "gpus": []}


class RunScript:
    """Journals of a scripted run: ``nproc`` ranks per host, global rank = host * nproc + lr."""

    def __init__(self, hosts: list[str], nproc: int = 2, t0: float = T0):
        self.hosts = list(hosts)
        self.nproc = nproc
        self.t0 = t0
        self.recs: dict[str, list[list]] = {h: [] for h in hosts}
        self.offsets: dict[tuple, int] = {}

    def rank(self, node: str, local_rank: int) -> int:
        return self.hosts.index(node) * self.nproc + local_rank

    def launched(self, ts: float | None = None) -> "RunScript":
        ts = self.t0 if ts is None else ts
        for node in self.hosts:
            self.recs[node].append([event("launched", ts, pid=1000, launch=1)])
            for lr in range(self.nproc):
                self.recs[node].append([{
                    "k": "file", "f": lr, "rank": self.rank(node, lr), "local_rank": lr,
                    "pid": 1000 + lr, "stream": "stdout", "attempt": 0, "instance": "i0",
                    "path": "/runs/%s/%s/torchrun/i0/attempt_0/%d/stdout.log" % (
                        RUN_ID, node, lr)}])
        return self

    def lines(self, node: str, local_rank: int, lines: list[str], ts: float) -> "RunScript":
        text = "".join(line + "\n" for line in lines)
        offset = self.offsets.get((node, local_rank), 0)
        self.offsets[(node, local_rank)] = offset + len(protocol.text_to_bytes(text))
        self.recs[node].append([{"k": "data", "f": local_rank, "o": offset, "ts": ts}, text])
        return self

    def everywhere(self, lines: list[str], ts: float) -> "RunScript":
        """The same lines from every rank (what collapsing is for)."""
        for node in self.hosts:
            for lr in range(self.nproc):
                self.lines(node, lr, lines, ts)
        return self

    def steps(self, first: int, last: int, every: int = 1) -> "RunScript":
        """Steps ``first..last`` on every rank: a log line and a metric record each."""
        ts = self.t0 + 10
        for step in range(first, last + 1, every):
            t = ts + step * 0.5
            for node in self.hosts:
                for lr in range(self.nproc):
                    rank = self.rank(node, lr)
                    loss = 4.0 / (1.0 + 0.08 * step) + 0.01 * rank + 0.05 * ((step * 7) % 5) / 5
                    lr_value = 3e-4 * min(1.0, step / 10)
                    self.lines(node, lr, ["step %d loss=%.4f lr=%.2e step_time=0.500s "
                                          "tok/s=32768" % (step, loss, lr_value)], t)
                    self.recs[node].append([{"k": "metric", "f": lr, "step": step,
                                             "loss": round(loss, 4), "lr": lr_value,
                                             "step_time": 0.5, "tok_s": 32768.0, "ts": t}])
        return self

    def ckpt(self, node: str, step: int, path: str, size: int, ts: float) -> "RunScript":
        self.recs[node].append([{"k": "ckpt", "f": 0, "step": step, "path": path,
                                 "bytes": size, "ts": ts}])
        return self

    def ckpt_done(self, node: str, step: int, path: str, size: int, seconds: float,
                  ts: float, complete: bool = True) -> "RunScript":
        """The node's agent found the save of ``path`` complete (or not) after ``seconds``."""
        self.recs[node].append([{"k": "ckpt_done", "f": 0, "step": step, "path": path,
                                 "bytes": size, "seconds": seconds, "complete": complete,
                                 "missing": [] if complete else ["optimizer.pt"], "ts": ts}])
        return self

    def crash(self, node: str, local_rank: int, exit_code: int, message: str,
              ts: float) -> "RunScript":
        rank = self.rank(node, local_rank)
        self.lines(node, local_rank, ["Traceback (most recent call last):",
                                      "RuntimeError: %s" % message], ts)
        self.recs[node].append([event("ended", ts + 1, state="failed", exit_code=exit_code,
                                      cause={"message": "rank %d (local %d) exited with code "
                                             "%d: RuntimeError: %s" % (rank, local_rank,
                                                                       exit_code, message),
                                             "rank": rank})])
        return self

    def transport(self, gpus: dict | None = None, states: dict | None = None,
                  hosts: dict | None = None, **kwargs) -> ScriptedTransport:
        """A ScriptedTransport whose nodes replay these journals (one message per record);
        ``gpus``/``hosts``: a node's GPU snapshot (default: ``nproc`` H100s) and host
        sample (default: none)."""
        t = ScriptedTransport(**kwargs)
        for node in self.hosts:
            sn = t.node(node)
            for rec in self.recs[node]:
                sn.append([rec])
            sn.gpu = (gpus or {}).get(node, gpu_snapshot(self.nproc))
            sn.host = (hosts or {}).get(node)
            if states and node in states:
                sn.state = states[node]
        return t


def standard_script(hosts: list[str], nproc: int = 2, steps: int = 24,
                    t0: float = T0) -> RunScript:
    """A healthy run: launched, a banner from every rank, ``steps`` steps, a checkpoint.

    Timestamps start at ``t0``; pass ``time.time()`` for a run that is not stalled."""
    s = RunScript(hosts, nproc, t0).launched()
    s.everywhere(["using device cuda:0, world size %d" % (len(hosts) * nproc),
                  "loading dataset shard"], t0 + 5)
    s.steps(1, steps)
    s.ckpt(hosts[0], 20, "/ckpt/%s/step_20.pt" % RUN_ID, 734003200, t0 + 21)
    return s


def inventory(workdir: str, hosts: int = 4, slots: int = 2) -> Inventory:
    """``hosts`` local nodes node1, node2, ... (as the scripted runs name them)."""
    return local_inventory(workdir, hosts, first=1, python=sys.executable, path="",
                           slots=slots)


def controller(workdir: str, transport: Transport, hosts: int = 4, slots: int = 2,
               steps: int | None = 40) -> tuple[RunController, callable]:
    """A real RunController over ``transport`` and the ``launch`` coroutine function for it."""
    inv = inventory(workdir, hosts, slots)
    ctl = RunController(inv, transport, History(workdir + "/history"), run_id=RUN_ID)
    args = ["--steps", str(steps)] if steps is not None else []
    spec = LaunchSpec(script="train.py", args=args, nproc_per_node=slots, grace=1.0)

    async def launch():
        await ctl.launch(spec, inventory_path="")
    return ctl, launch


def host_names(hosts: int = 4) -> list[str]:
    return ["node%d" % (i + 1) for i in range(hosts)]


__all__ = ["ScriptedTransport", "ScriptedNode", "RunScript", "Request", "standard_script",
           "controller", "inventory", "host_names", "gpu_snapshot", "no_gpu_snapshot",
           "host_sample", "event", "T0", "RUN_ID"]
