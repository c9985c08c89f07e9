"""Preflight: what each host has, checked against the inventory and against the other hosts.

Per host: Python and torch versions (torch must match across hosts), CUDA and NCCL versions,
GPU count against the inventory, free GPU memory, free disk in the workdir, whether the
host's own hostname resolves (torchrun fails with gaierror otherwise), whether the rendezvous
host is reachable over TCP from this host, and clock skew against the laptop.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from .link import AgentError, NodeLink
from .state import human_bytes

MIN_DISK = 1 << 30
MAX_SKEW = 5.0


@dataclass
class HostCheck:
    name: str
    reachable: bool = True
    cause: str | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)
    rtt_ms: float | None = None
    skew_s: float | None = None
    rdzv: str | None = None

    @property
    def ok(self) -> bool:
        return self.reachable and not self.problems


async def _one(link: NodeLink, check: HostCheck) -> None:
    t0 = time.time()
    pong = await link.request("ping", timeout=30)
    t1 = time.time()
    check.rtt_ms = round((t1 - t0) * 1000, 1)
    check.skew_s = round(pong["time"] - (t0 + t1) / 2, 3)
    host = link.host
    check.facts = await link.request("preflight", python=host.python or "",
                                     workdir=host.workdir, timeout=180)


async def _reachability(links: dict[str, NodeLink], rdzv: NodeLink, checks: dict) -> None:
    """Every node opens a TCP connection to a listener on the rendezvous host's addr."""
    addr = rdzv.host.addr
    try:
        port = (await rdzv.request("listen", addr=addr))["port"]
    except AgentError as exc:
        checks[rdzv.name].problems.append("cannot listen on rendezvous addr %s: %s"
                                          % (addr, exc))
        return
    try:
        results = await asyncio.gather(*(l.request("probe_tcp", addr=addr, port=port, timeout=3)
                                         for l in links.values()), return_exceptions=True)
        for link, res in zip(links.values(), results):
            c = checks[link.name]
            if isinstance(res, BaseException):
                c.problems.append("rendezvous probe failed: %s" % res)
            elif res.get("ok"):
                c.rdzv = "ok %.0f ms" % res["ms"]
            else:
                c.rdzv = "unreachable"
                c.problems.append("cannot reach the rendezvous host %s (%s:%d) over TCP: %s; "
                                  "check firewalls and that addr is this network's address"
                                  % (rdzv.name, addr, port, res.get("error")))
    finally:
        try:
            await rdzv.request("unlisten", port=port)
        except AgentError:
            pass


def _judge(checks: dict[str, HostCheck], hosts: dict) -> None:
    live = [c for c in checks.values() if c.reachable and c.facts]
    torch = Counter(c.facts.get("torch") for c in live if c.facts.get("torch"))
    common = torch.most_common(1)[0][0] if torch else None
    for c in live:
        f, host = c.facts, hosts[c.name]
        if f.get("python_error"):
            c.problems.append("python: %s; set `python:` for this host" % f["python_error"])
        elif f.get("torch_error"):
            c.problems.append("torch cannot be imported by %s: %s" % (f.get("executable"),
                                                                     f["torch_error"]))
        elif common and f.get("torch") != common:
            others = sorted(o.name for o in live if o.facts.get("torch") == common)
            c.problems.append("torch %s differs from torch %s on %s; every node needs the same "
                              "torch" % (f.get("torch"), common, ", ".join(others)))
        found = len(f.get("gpus") or [])
        if host.gpus and found < host.gpus:
            why = "" if found else " (%s)" % (f.get("gpu_reason") or "none found")
            c.problems.append("%d GPU(s) found, the inventory expects %d%s"
                              % (found, host.gpus, why))
        if not f.get("workdir_exists"):
            c.problems.append("workdir %s does not exist on the host" % f.get("workdir"))
        if f.get("disk_free") is not None and f["disk_free"] < MIN_DISK:
            c.problems.append("only %s free in %s" % (human_bytes(f["disk_free"]),
                                                       f.get("workdir")))
        if f.get("hostname_resolves") is None:
            c.problems.append("the host's own name %r does not resolve (%s); torchrun fails "
                              "with gaierror: add it to /etc/hosts" % (f.get("hostname"),
                                                                       f.get("hostname_error")))
        if c.skew_s is not None and abs(c.skew_s) > MAX_SKEW:
            c.warnings.append("clock differs from this laptop's by %.1f s" % c.skew_s)


async def run_preflight(links: dict[str, NodeLink], hosts: dict, failed: dict,
                        rdzv_name: str) -> list[HostCheck]:
    checks = {name: HostCheck(name) for name in hosts}
    for name, exc in failed.items():
        checks[name].reachable = False
        checks[name].cause = "%s: %s" % (getattr(exc, "cause", "error"), exc)
    live = {n: l for n, l in links.items() if n not in failed and l.stream is not None}
    results = await asyncio.gather(*(_one(l, checks[n]) for n, l in live.items()),
                                   return_exceptions=True)
    for name, res in zip(live, results):
        if isinstance(res, BaseException):
            checks[name].problems.append("preflight failed: %s" % res)
    if rdzv_name in live:
        await _reachability(live, live[rdzv_name], checks)
    _judge(checks, hosts)
    return [checks[n] for n in hosts]


def table(checks: list[HostCheck]) -> str:
    rows = [("host", "python", "torch", "cuda/nccl", "gpus", "disk free", "rdzv", "skew",
             "verdict")]
    for c in checks:
        f = c.facts
        if not c.reachable:
            rows.append((c.name, "", "", "", "", "", "", "", "UNREACHABLE"))
            continue
        cuda = "%s/%s" % (f.get("cuda") or "-", f.get("nccl") or "-")
        rows.append((c.name, f.get("python", "?"), f.get("torch", "?"), cuda,
                     str(len(f.get("gpus") or [])), human_bytes(f.get("disk_free")),
                     c.rdzv or "?", "%+.2fs" % c.skew_s if c.skew_s is not None else "?",
                     "ok" if c.ok else "PROBLEM"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for c in checks:
        if c.cause:
            lines.append("%s: %s" % (c.name, c.cause))
        lines += ["%s: %s" % (c.name, p) for p in c.problems]
        lines += ["%s: warning: %s" % (c.name, w) for w in c.warnings]
    return "\n".join(lines)


async def run_check(args) -> int:
    """`rankdeck check -i INVENTORY [--json]`: 0 all good, 1 problems, 3 unreachable hosts."""
    import os

    from inventory.loader import load_inventory
    from .commands import make_transport, resolve_local
    from .run import RunController

    inv = resolve_local(load_inventory(os.path.abspath(args.inventory)), os.getcwd())
    ctl = RunController(inv, make_transport(inv.transport, args.accept_new_host_keys))
    try:
        failed = await ctl.connect_all(reconnect=False)
        checks = await run_preflight(ctl.links, {h.name: h for h in inv.hosts}, failed,
                                     inv.hosts[0].name)
    finally:
        await ctl.close()
    if args.json:
        json.dump([dict(asdict(c), ok=c.ok) for c in checks], sys.stdout, indent=1)
        print()
    else:
        print(table(checks))
    if failed:
        return 3
    return 0 if all(c.ok for c in checks) else 1
