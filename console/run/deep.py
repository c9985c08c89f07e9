"""The deep check, ``rankdeck check --deep`` and ``launch --preflight deep`` (docs/HEALTH.md):
the preflight's facts (console/run/preflight.py) and, over them, the network between the
nodes, measured with the run's own stack (agent/serve/netprobe.py, planned and judged by
agent/rules/health.py), the disk where checkpoints go (free space, write speed), the clock,
and the same Python, torch, CUDA and NCCL (and synced code) on every node.

Every figure a host sends is untrusted: pairs are taken by rank number, checked against the
plan, and named with the inventory's names, never the host's. A node named here is a
*suspect*: its problems say why, with its figure and the median it is compared with.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections import Counter
from statistics import median

from agent.rules import health, kinds
from agent.wire.sync import SHA_RE
from ..errors import AgentError
from ..lines.sanitize import clean
from .preflight import MAX_SKEW, HostCheck, problem_lines
from ..surgery.surgery import ACTIVE, CORDONED

CHECK_ROOT = "~/.cache/rankdeck/checks"  # the check's store folder on the first host
NET_SECONDS = 1.0  # a pair's exchange: about this long ...
NET_MAX_MB = 256  # ... or this many MB, whichever first
NET_LIMIT_S = 180.0  # torch's timeout for the probes' store and process group: the last
# host to import torch joins within it (a check of 8 hosts on 2 cores at load 14 failed
# with 60 s)
GPU_FRACTION = 0.8  # a GPU under 80 % of the cluster's median matmul or copy is named
# throttle reasons that mean a fault or cooling, not load (idle, power cap and app clocks are
# normal); the PCIe generation is not judged: a link drops its generation when idle
HW_THROTTLE = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")
VERSIONS = (("python", "Python"), ("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"))


def _gbps(value):
    if value is None:
        return None
    if not kinds.finite(value) or value < 0:
        raise ValueError("a figure that is not a rate: %r" % (value,))
    return float(value)


def _gpu_figures(raw):
    """[{"index", "tflops", "copy_gbps", "error"}] of one host's answer, numbers checked."""
    out = []
    for item in (raw if isinstance(raw, list) else [])[:64]:
        if not isinstance(item, dict) or not isinstance(item.get("index"), int):
            continue
        entry = {"index": item["index"]}
        for key in ("tflops", "copy_gbps"):
            try:
                entry[key] = _gbps(item.get(key))
            except ValueError:
                entry[key] = None
        if item.get("error"):
            entry["error"] = clean(str(item["error"]), limit=300)
        out.append(entry)
    return out


def judge_gpus(checks: list[HostCheck], net: dict) -> None:
    """Each GPU's NVML health (the preflight's ``gpu_health``) and its matmul and copy
    figures against the cluster's median (under GPU_FRACTION of it is named). Written
    against a fake pynvml only: untested on real GPUs."""
    by_name = {c.name: c for c in checks}
    figures = net.get("gpus") or {}
    for key, label, unit in (("tflops", "bf16 matmul", "TFLOP/s"),
                             ("copy_gbps", "memory copy", "GB/s")):
        values = [g[key] for gs in figures.values() for g in gs if g.get(key)]
        ref = median(values) if values else None
        for name, gs in figures.items():
            for g in gs:
                if g.get("error"):
                    by_name[name].problems.append("GPU %d: could not be measured: %s"
                                                  % (g["index"], g["error"]))
                elif ref and g.get(key) is not None and g[key] < ref * GPU_FRACTION:
                    by_name[name].problems.append("GPU %d: %s %.0f %s, the cluster's median "
                                                  "%.0f" % (g["index"], label, g[key], unit,
                                                            ref))
    for c in checks:
        for g in c.facts.get("gpu_health") or []:
            if not isinstance(g, dict):
                continue
            c.problems += ["GPU %s: %s" % (g.get("index"), p) for p in gpu_problems(g)]


def gpu_problems(g: dict) -> list[str]:
    """What one GPU's health fields say is wrong, in words."""
    out = []
    if _positive(g.get("ecc_uncorrected")):
        out.append("%d uncorrected ECC errors" % g["ecc_uncorrected"])
    if g.get("retired_pending"):
        out.append("a page retirement waits for a GPU reset")
    if _positive(g.get("retired_dbe")):
        out.append("%d pages retired for double-bit errors" % g["retired_dbe"])
    if g.get("xid"):
        out.append("Xid errors %s" % ", ".join(str(x[1]) for x in g["xid"][:8]
                                                if isinstance(x, list) and len(x) == 2))
    bad = [t for t in (g.get("throttle") or []) if t in HW_THROTTLE]
    if bad:
        out.append("clocks held down: %s" % ", ".join(bad))
    if _positive(g.get("pcie_width")) and _positive(g.get("pcie_width_max")) and \
            g["pcie_width"] < g["pcie_width_max"]:
        out.append("PCIe link x%d of x%d" % (g["pcie_width"], g["pcie_width_max"]))
    if g.get("pids"):
        out.append("processes already hold its memory: pid %s"
                   % ", ".join(str(p) for p in g["pids"][:8]))
    return out


def _positive(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _pairs(raw, n, planned):
    """[(a, b, gbps)] from a host's answer: only planned pairs, each once."""
    if not isinstance(raw, list):
        raise ValueError("pairs are not a list")
    out, seen = [], set()
    for item in raw[:4 * n + 8]:
        if not (isinstance(item, list) and len(item) == 3):
            raise ValueError("a pair is not [a, b, gbps]")
        a, b = item[0], item[1]
        if (a, b) not in planned or (a, b) in seen:
            raise ValueError("pair %r was not planned" % ((a, b),))
        seen.add((a, b))
        out.append((a, b, _gbps(item[2])))
    return out


async def network(ctl, checks: list[HostCheck]) -> dict:
    """Measure the network between the nodes that passed the basic facts (torch found);
    ``{"rounds", "recheck_rounds", "every_pair", "seconds", "reference", "floor", "nodes":
    {name: gbps}, "pairs": [...], "slow_nodes", "slow_links"}`` or ``{"error"}``."""
    live = [c for c in checks if c.reachable and c.facts.get("torch")]
    if len(live) < 2:
        return {"error": "fewer than two nodes with torch: no network to measure"}
    hosts = [ctl.inventory.host(c.name) for c in live]
    names = [h.name for h in hosts]
    first, n = hosts[0], len(hosts)
    check_id = secrets.token_hex(4)
    root = "%s/%s" % (CHECK_ROOT, check_id)
    link0 = ctl.links[first.name]
    started = time.monotonic()
    try:  # answered once its port is bound: the probes import torch while the store does
        store = await link0.request("store_start", run_root=root, addr=first.addr,
                                    python=first.python or sys.executable, early=True,
                                    timeout=180)
    except AgentError as exc:
        return {"error": "%s: could not start the check's store: %s" % (first.name, exc)}
    try:
        *answers, served = await asyncio.gather(*(
            ctl.links[h.name].request(
                "netcheck", addr=first.addr, port=store["port"], rank=i, world=n,
                python=h.python or sys.executable, seconds=NET_SECONDS, max_mb=NET_MAX_MB,
                limit_s=NET_LIMIT_S, check=check_id, timeout=NET_LIMIT_S * 4 + 120)
            for i, h in enumerate(hosts)), link0.request(
                "store_wait", run_root=root, wait=170, timeout=180), return_exceptions=True)
        if isinstance(served, BaseException):
            return {"error": "%s: could not start the check's store: %s"
                    % (first.name, clean(str(served), limit=600))}
    finally:
        try:
            await link0.request("store_stop", run_root=root, timeout=30)
        except AgentError:
            pass
    failed = {}
    for name, ans in zip(names, answers):
        if isinstance(ans, BaseException):
            failed[name] = clean(str(ans), limit=300)
        elif not isinstance(ans, dict) or ans.get("error"):
            failed[name] = clean(str(ans.get("error") if isinstance(ans, dict) else ans),
                                 limit=600)
    if failed:
        return {"error": "the network probe failed", "failed": failed}
    plan = health.rounds(n)
    planned = {p for r in plan for p in r}
    try:
        pairs = _pairs(answers[0].get("pairs"), n, planned)
        rechecks = health.recheck_rounds(n, pairs)
        again = _pairs(answers[0].get("again", []), n, {p for r in rechecks for p in r})
    except ValueError as exc:
        return {"error": "%s sent figures rankdeck cannot read: %s"
                % (first.name, clean(str(exc), limit=200))}
    v = health.verdict(n, pairs, again)
    gpus = {name: _gpu_figures(ans.get("gpus")) for name, ans in zip(names, answers)}
    rounds_s = answers[0].get("rounds_s")
    if not kinds.finite(rounds_s):
        rounds_s = None
    return {"gpus": gpus, "rounds_s": rounds_s,
            "rounds": len(plan), "recheck_rounds": len(rechecks),
            "every_pair": health.every_pair(n), "seconds": round(time.monotonic() - started, 1),
            "backend": clean(str(answers[0].get("backend", "?")), limit=20),
            "reference": v["reference"], "floor": v["floor"],
            "nodes": {names[i]: g for i, g in v["nodes"].items()},
            "pairs": [{"a": names[a], "b": names[b], "gbps": g} for a, b, g in pairs],
            "rechecked": [{"a": names[a], "b": names[b], "gbps": g} for a, b, g in again],
            "slow_nodes": [names[i] for i in v["slow_nodes"]],
            "slow_links": [(names[a], names[b], g) for a, b, g in v["slow_links"]]}


def judge_network(checks: list[HostCheck], net: dict) -> None:
    """The network's verdict into each host's problems (with its figure and the median)."""
    by_name = {c.name: c for c in checks}
    if net.get("error"):
        for name, why in (net.get("failed") or {}).items():
            by_name[name].problems.append("network check failed: %s" % why)
        if not net.get("failed"):
            for c in checks:
                if c.reachable and c.facts.get("torch"):
                    c.warnings.append("network not measured: %s" % net["error"])
        return
    ref = net["reference"] or 0.0
    for name in net["slow_nodes"]:
        by_name[name].problems.append(
            "network: %s Gbit/s at best, the median node %s Gbit/s (a node under 1/3 of the "
            "median is named)" % (_fig(net["nodes"].get(name)), _fig(ref)))
    for a, b, g in net["slow_links"]:
        for name, other in ((a, b), (b, a)):
            by_name[name].problems.append(
                "network: the link to %s ran %s Gbit/s, the median node %s Gbit/s; each end "
                "is fast with a third node: the link is the suspect" % (other, _fig(g),
                                                                        _fig(ref)))


def _fig(g):
    return "?" if g is None else ("%.3g" % g)


def judge_hosts(checks: list[HostCheck]) -> None:
    """Disk, clock and versions, compared across the nodes (the deep check's host part)."""
    live = [c for c in checks if c.reachable and c.facts]
    for key, label in VERSIONS:
        seen = Counter(c.facts.get(key) for c in live if c.facts.get(key))
        if len(seen) < 2 or key == "torch":  # torch: the basic preflight says it already
            continue
        common = seen.most_common(1)[0][0]
        for c in live:
            if c.facts.get(key) and c.facts[key] != common:
                c.problems.append("%s %s differs from %s %s on the other nodes"
                                  % (label, c.facts[key], label, common))
    speeds = [c.facts["disk_write_mbps"] for c in live
              if isinstance(c.facts.get("disk_write_mbps"), (int, float))]
    ref = median(speeds) if speeds else None
    for c in live:
        f = c.facts
        if f.get("disk_write_error"):
            c.problems.append("disk: %s" % f["disk_write_error"])
        elif ref and isinstance(f.get("disk_write_mbps"), (int, float)) and \
                f["disk_write_mbps"] < ref * health.SLOW_FRACTION:
            c.problems.append("disk: writes %.0f MB/s in %s, the median node %.0f MB/s"
                              % (f["disk_write_mbps"], f.get("disk_dir"), ref))
        if c.skew_s is not None and abs(c.skew_s) > MAX_SKEW:
            c.problems.append("clock: %+.1f s from this laptop's" % c.skew_s)
            c.warnings = [w for w in c.warnings if not w.startswith("clock differs")]


def report(checks: list[HostCheck], net: dict) -> dict:
    """``check --deep --json``'s document: per node name, ok, problems, net_gbps and the
    rest of its facts; the network's figures; ``suspects``: the nodes not ok."""
    nodes = []
    for c in checks:
        nodes.append({"name": c.name, "ok": c.ok, "reachable": c.reachable,
                      "problems": c.problems, "warnings": c.warnings,
                      "net_gbps": (net.get("nodes") or {}).get(c.name),
                      "disk_free": c.facts.get("disk_free"),
                      "disk_write_mbps": c.facts.get("disk_write_mbps"),
                      "skew_s": c.skew_s, "cause": c.cause,
                      "gpus": (net.get("gpus") or {}).get(c.name, []),
                      "gpu_health": c.facts.get("gpu_health", []),
                      **{k: c.facts.get(k) for k, _ in VERSIONS}})
    network = {k: net.get(k) for k in ("rounds", "recheck_rounds", "every_pair", "seconds",
                                       "rounds_s",
                                       "backend", "reference", "pairs", "rechecked",
                                       "slow_links", "error")}
    return {"nodes": nodes, "suspects": [c.name for c in checks if not c.ok],
            "network": network}


def deep_table(checks: list[HostCheck], net: dict) -> str:
    """The deep check in words: a row per node, then the network's rounds and each
    suspect's problems."""
    from ..lines.text import columns, human_bytes
    rows = [("host", "net Gbit/s", "disk free", "write MB/s", "skew", "verdict")]
    for c in checks:
        g = (net.get("nodes") or {}).get(c.name)
        w = c.facts.get("disk_write_mbps")
        rows.append((c.name, _fig(g), human_bytes(c.facts.get("disk_free")),
                     "?" if w is None else "%.0f" % w,
                     "%+.2fs" % c.skew_s if c.skew_s is not None else "?",
                     "ok" if c.ok else ("UNREACHABLE" if not c.reachable else "SUSPECT")))
    lines = columns(rows)
    if not net.get("error"):
        lines.append("network: %d rounds (+%d rechecks) instead of %d pairs, %.1f s, %s; "
                     "median node %s Gbit/s" % (net["rounds"], net["recheck_rounds"],
                                                net["every_pair"], net["seconds"],
                                                net["backend"], _fig(net["reference"])))
    return "\n".join(lines + problem_lines(checks))


async def same_code(ctl, checks: list[HostCheck], tree: str) -> dict:
    """Each reachable node's workdir asked whether it holds ``tree`` (the sync's hash)
    untouched since: ``{name: the agent's sync_check answer, or the error}``."""
    live = [c for c in checks if c.reachable]
    answers = await asyncio.gather(*(
        ctl.links[c.name].request("sync_check", workdir=ctl.inventory.host(c.name).workdir,
                                  tree=tree, timeout=60) for c in live),
        return_exceptions=True)
    return {c.name: a for c, a in zip(live, answers)}


def judge_code(checks: list[HostCheck], tree: str, answers: dict) -> None:
    """The same code on every node: a node whose workdir does not hold ``tree`` (the tree
    this launch synced), or holds it with a file changed since, is named. A host's tree hash
    is shown only when it looks like one."""
    for c in checks:
        if c.name not in answers:
            continue
        ans = answers[c.name]
        if isinstance(ans, BaseException) or not isinstance(ans, dict):
            c.problems.append("code: not compared with the synced tree %s: %s"
                              % (tree[:12], clean(str(ans), limit=200)))
            continue
        if ans.get("same") is True:
            continue
        placed = ans.get("tree")
        placed = placed if isinstance(placed, str) and SHA_RE.match(placed) else None
        where = clean(str(ans.get("workdir") or "the workdir"), limit=200)
        if placed == tree:
            c.problems.append("code: a file of tree %s in %s changed since the sync"
                              % (tree[:12], where))
        elif placed:
            c.problems.append("code: %s holds tree %s, not the synced tree %s"
                              % (where, placed[:12], tree[:12]))
        else:
            c.problems.append("code: %s holds no tree rankdeck placed, not the synced tree %s"
                              % (where, tree[:12]))


async def deep_check(ctl, failed: dict, ckpt_dir: str | None = None, hosts=None,
                     spec=None, tree: str | None = None) -> tuple[list[HostCheck], dict]:
    """The preflight with the deep facts, then the network: ``(checks, net)``. ``spec``:
    before a launch (its script checked too, a missing workdir a problem). ``tree``: the
    hash of the tree the launch synced, compared on every node (None: no code is judged)."""
    checks = await ctl.preflight(hosts=hosts, failed=failed, spec=spec, deep=True,
                                 ckpt_dir=ckpt_dir)
    judge_hosts(checks)
    if tree:
        judge_code(checks, tree, await same_code(ctl, checks, tree))
    net = await network(ctl, checks)
    judge_network(checks, net)
    judge_gpus(checks, net)
    return checks, net


def kind_of(problem: str) -> str:
    """What a problem is about (console/model/health.py KINDS), by its first words."""
    for start, kind in (("network check failed", "probe"), ("network: the link", "link"),
                        ("network:", "network"), ("disk:", "disk"), ("clock:", "clock"),
                        ("GPU ", "gpu"), ("code:", "code")):
        if problem.startswith(start):
            return kind
    return "versions" if " differs from " in problem else "host"


def health_entry(c: HostCheck, net: dict) -> dict:
    """What the run keeps of one node's deep check (``status``'s ``nodes[].health``,
    docs/STATUS.md): ok, the kind of its first problem, its problems, its figures."""
    return {"ok": c.ok, "kind": kind_of(c.problems[0]) if c.problems else
            ("ok" if c.ok else "host"), "problems": list(c.problems),
            "net_gbps": (net.get("nodes") or {}).get(c.name),
            "disk_write_mbps": c.facts.get("disk_write_mbps")}


async def launch_preflight(ctl, hosts: list, spec, tree: str | None = None) -> list:
    """``launch --preflight deep``: the deep check of ``hosts`` (the store's host first;
    ``tree``: the hash of the tree ``--sync`` placed, compared on every node). Each node's
    result is kept in the run's state (``status``, the nodes table). A suspect node is left
    out and a healthy spare of the inventory takes its place, said in the run's events; with
    no spare left for it, LaunchError naming it with its figure (nothing is started). A
    suspect spare is left out. The hosts the run goes on with."""
    from ..errors import EXIT_FAILED, EXIT_USAGE, LaunchError
    for h in hosts:
        ctl.state.set_node(h.name, "preflight")
    checks, net = await deep_check(ctl, {}, spec.checkpoint_dir, hosts=hosts, spec=spec,
                                   tree=tree)
    by_name = {c.name: c for c in checks}
    for c in checks:
        ctl.state.set_health(c.name, health_entry(c, net))
    bad = [h for h in hosts if not by_name[h.name].ok and not h.spare]
    spares = [h for h in hosts if h.spare and by_name[h.name].ok]
    for c in checks:
        if not c.ok:
            ctl.state.set_node(c.name, "preflight failed", "; ".join(c.problems))
    if bad and (len(spares) < len(bad) or any(by_name[h.name].bad_input for h in bad)):
        raise LaunchError("the deep preflight names %s; nothing was started (rankdeck launch "
                          "--skip-preflight starts anyway%s):\n%s"
                          % (", ".join(h.name for h in bad),
                             "" if spares else "; a spare in the inventory would take its "
                             "place", deep_table(checks, net)),
                          EXIT_USAGE if any(by_name[h.name].bad_input for h in bad)
                          else EXIT_FAILED,
                          {h.name: "; ".join(by_name[h.name].problems) for h in bad})
    out = [h for h in hosts if by_name[h.name].ok]
    for sick, spare in zip(bad, spares):
        spare.spare = False  # in the run, in the sick node's place
        ctl.state.set_role(spare.name, ACTIVE)
        ctl.state.set_role(sick.name, CORDONED)  # out of the run: its state says why
        ctl.state.set_node(sick.name, "preflight failed", "; ".join(by_name[sick.name].problems))
        ctl.state.add_event(spare.name, "preflight", "%s takes the place of %s, which the "
                            "deep preflight names: %s" % (spare.name, sick.name,
                                                         "; ".join(by_name[sick.name].problems)))
    for c in checks:
        if c.ok:
            g = (net.get("nodes") or {}).get(c.name)
            ctl.state.add_event(c.name, "preflight", "deep preflight ok (%s Gbit/s)" % _fig(g))
    return out
