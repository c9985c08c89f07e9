"""Preflight: what each host has, checked against the inventory and against the other hosts.

Per host: Python and torch versions (torch must match across hosts), CUDA and NCCL versions,
GPU count against the inventory, free GPU memory, free disk in the workdir, whether the
host's own hostname resolves (torchrun fails with gaierror otherwise), whether the rendezvous
host is reachable over TCP from this host, and clock skew against the laptop. Before a launch
also: the workdir exists and this login user can write in it, the python path exists, and
the script (or ``-m`` module) is there, all as the host reads the paths (``~`` is its home).
Problems of the inventory or the run spec (those four) mark the check ``bad_input``: a launch
refused for them exits 2, like any other bad input. Facts an older agent does not send are
not judged.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from ..errors import AgentError
from . import facts as answers
from .link import NodeLink
from ..lines.sanitize import clean_tree
from ..lines.text import columns, human_bytes

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
    bad_input: bool = False  # a problem of the inventory or run spec (a path), not the host

    @property
    def ok(self) -> bool:
        return self.reachable and not self.problems


async def _one(link: NodeLink, check: HostCheck, script: str | None, module: bool,
               deep: dict) -> None:
    t0 = time.time()
    pong = await link.request("ping", timeout=30)
    t1 = time.time()
    check.rtt_ms = round((t1 - t0) * 1000, 1)
    when = pong.get("time") if isinstance(pong, dict) else None
    check.skew_s = round(when - (t0 + t1) / 2, 3) if answers.number(when) else None
    host = link.host
    args = {"python": host.python or "", "workdir": host.workdir}
    if script:
        args.update(script=script, module=module)
    args.update(deep)  # `check --deep`: the disk's write speed too (console/run/deep.py)
    # host text (error messages, paths) is printed in the check table: cleaned of escapes
    check.facts, malformed = answers.checked(clean_tree(await link.request(
        "preflight", timeout=180, **args)))
    if malformed:  # untrusted: judged without them, and said
        check.problems.append("the host's preflight answer is malformed (%s): is its agent "
                              "rankdeck's?" % ", ".join(malformed[:8]))


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


def _judge(checks: dict[str, HostCheck], hosts: dict, launching: bool) -> None:
    live = [c for c in checks.values() if c.reachable and c.facts]
    torch = Counter(c.facts.get("torch") for c in live if c.facts.get("torch"))
    common = torch.most_common(1)[0][0] if torch else None
    for c in live:
        f, host = c.facts, hosts[c.name]
        if f.get("python_exists") is False:
            pass  # said once, by _judge_paths, with the path as the inventory gives it
        elif f.get("python_error"):
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
        _judge_paths(c, f, host.python, launching)
        if f.get("disk_free") is not None and f["disk_free"] < MIN_DISK:
            c.problems.append("only %s free in %s" % (human_bytes(f["disk_free"]),
                                                       f.get("workdir")))
        if f.get("hostname_resolves") is None:
            c.problems.append("the host's own name %r does not resolve (%s); torchrun fails "
                              "with gaierror: add it to /etc/hosts" % (f.get("hostname"),
                                                                       f.get("hostname_error")))
        if c.skew_s is not None and abs(c.skew_s) > MAX_SKEW:
            c.warnings.append("clock differs from this laptop's by %.1f s" % c.skew_s)


def _judge_paths(c: HostCheck, f: dict, python: str, launching: bool) -> None:
    """The workdir, python and script as the host found them (agent/serve/preflight.py facts).
    ``launching``: for a launch (a missing workdir is a problem), not `check`."""
    before = len(c.problems)
    workdir = f.get("workdir")
    if not f.get("workdir_exists") and not launching:
        # `check` before the first launch: `launch --sync` makes the workdir, so not a problem
        c.warnings.append("workdir %s is not there yet; `rankdeck launch --sync DIR` creates "
                          "it" % workdir)
    elif not f.get("workdir_exists"):
        c.problems.append("workdir %s does not exist on the host; create it, or use "
                          "`rankdeck launch --sync DIR`, which creates it" % workdir)
    elif f.get("workdir_writable") is False:
        c.problems.append("workdir %s is not writable by the login user; rankdeck writes the "
                          "run's logs there: pick a workdir of this user (`workdir:`) or fix "
                          "its permissions" % workdir)
    if f.get("python_exists") is False:
        c.problems.append("python %s does not exist on the host; set `python:` for this host "
                          "to the training interpreter's path there" % (python or "python3"))
    if f.get("script_exists") is False:
        if f.get("script_module"):
            why = " (%s)" % f["script_error"] if f.get("script_error") else ""
            c.problems.append("module %s not found by %s from workdir %s%s: use `rankdeck "
                              "launch --sync DIR` to send your code, or put it there"
                              % (f.get("script"), f.get("python_path") or "python", workdir,
                                 why))
        else:
            c.problems.append("script %s is not on the host: use `rankdeck launch --sync DIR` "
                              "to send your code, or put it there" % f.get("script"))
    elif f.get("script_exists") is None and f.get("script_error"):
        c.warnings.append("could not check that %s is there: %s" % (f.get("script"),
                                                                    f["script_error"]))
    if len(c.problems) > before:
        c.bad_input = True


async def run_preflight(links: dict[str, NodeLink], hosts: dict, failed: dict,
                        rdzv_name: str, script: str | None = None,
                        module: bool = False, launching: bool = False, deep: bool = False,
                        ckpt_dir: str | None = None) -> list[HostCheck]:
    """Check every host of ``hosts`` ({name: Host}); ``failed``: {name: error} of the ones
    that could not be reached. ``script``/``module``: also check the run's script is there.
    ``deep``: also the write speed where checkpoints go (``ckpt_dir``, else the workdir)."""
    extra = {"deep": True, "ckpt_dir": ckpt_dir} if deep else {}
    checks = {name: HostCheck(name) for name in hosts}
    for name, exc in failed.items():
        checks[name].reachable = False
        checks[name].cause = "%s: %s" % (getattr(exc, "cause", "error"), exc)
    live = {n: l for n, l in links.items() if n not in failed and l.stream is not None}
    results = await asyncio.gather(*(_one(l, checks[n], script, module, extra)
                                     for n, l in live.items()),
                                   return_exceptions=True)
    for name, res in zip(live, results):
        if isinstance(res, BaseException):
            checks[name].problems.append("preflight failed: %s" % res)
    if rdzv_name in live:
        await _reachability(live, live[rdzv_name], checks)
    _judge(checks, hosts, launching)
    return [checks[n] for n in hosts]


def check_table(checks: list[HostCheck]) -> str:
    """One row per host (versions, GPUs, disk, rendezvous, skew, verdict), then each host's
    problems and warnings in words."""
    rows = [("host", "python", "torch", "cuda/nccl", "gpus", "disk free", "rdzv", "skew",
             "verdict")]
    for c in checks:
        f = c.facts
        if not c.reachable:
            rows.append((c.name, "", "", "", "", "", "", "", "UNREACHABLE"))
            continue
        cuda = "%s/%s" % (f.get("cuda") or "-", f.get("nccl") or "-")
        rows.append((c.name, f.get("python") or "?", f.get("torch") or "?", cuda,
                     str(len(f.get("gpus") or [])), human_bytes(f.get("disk_free")),
                     c.rdzv or "?", "%+.2fs" % c.skew_s if c.skew_s is not None else "?",
                     "ok" if c.ok else "PROBLEM"))
    lines = columns(rows)
    return "\n".join(lines + problem_lines(checks))


def problem_lines(checks: list[HostCheck]) -> list[str]:
    """Under a check's table: each node's cause, problems and warnings, a line each."""
    lines = []
    for c in checks:
        if c.cause:
            lines.append("%s: %s" % (c.name, c.cause))
        lines += ["%s: %s" % (c.name, p) for p in c.problems]
        lines += ["%s: warning: %s" % (c.name, w) for w in c.warnings]
    return lines
