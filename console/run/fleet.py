"""The hosts of an inventory as a fleet: `rankdeck hosts` (console/verbs/hosts.py) asks every
host at once (one connection each, in parallel) what it is doing and has been through: its
load, its GPUs' memory and who holds it, its strays, its last runs, its incidents and whether
it is flagged (the agent's ``hosts`` request: agent/serve/hosts.py; the flag rule:
agent/rules/fleet.py). What this laptop's history saw of a host (a cordon it did) is added to
the host's own record. ``kill_strays`` asks each host to stop the login user's strays.

A host's answer is untrusted: every string in it is cleaned (console/lines/sanitize.py) and
each list bounded before anything is shown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from agent.rules import fleet as rules
from inventory.model import Host, Inventory
from ..lines.sanitize import clean_tree
from ..records.history import History
from ..errors import AgentError
from ..transport.base import HostUnreachable
from . import facts
from .run import RunController

MAX_LIST = 64
MiB = 1 << 20


def gpu_words(row: dict) -> str:
    used = [g.get("mem_used") for g in row["gpus"] if isinstance(g.get("mem_used"), int)]
    total = [g.get("mem_total") for g in row["gpus"] if isinstance(g.get("mem_total"), int)]
    if not row["gpus"]:
        return "no GPU"
    return "%d GPU %d/%d MiB" % (len(row["gpus"]), sum(used) // MiB, sum(total) // MiB)


def stray_words(s: dict) -> str:
    mem = " %d MiB" % (s["gpu_mem"] // MiB) if isinstance(s.get("gpu_mem"), int) else ""
    return "%s pid %s%s: %s" % (s.get("user"), s.get("pid"), mem, s.get("cmd"))


def lines(rows: list[dict]) -> list[str]:
    """The table: a line per host, then its strays and incidents indented under it."""
    out = []
    for r in rows:
        if not r["reachable"]:
            out.append("%s  unreachable: %s%s" % (r["name"], r.get("error"),
                                                   "  FLAGGED" if r["flagged"] else ""))
        else:
            load = "%.2f" % r["load"] if isinstance(r["load"], (int, float)) else "n/a"
            out.append("%s  load %s  %s  strays %d  %s%s" % (
                r["name"], load, gpu_words(r), len(r["strays"]), runs_words(r["runs"]),
                "  FLAGGED" if r["flagged"] else ""))
        out += ["    stray %s" % stray_words(s) for s in r["strays"]]
        out += ["    incident %s %s on %s: %s" % (i.get("run_id"), i.get("kind"), i.get("node"),
                                                  i.get("text")) for i in r["incidents"]]
    return out


def runs_words(runs: list) -> str:
    """``runs 5, last RUN``: a count and the newest run, not every id (a line, not a screen:
    `--json` lists them)."""
    return "runs %d, last %s" % (len(runs), runs[-1]) if runs else "no runs"


ASK_TIMEOUT = 30.0


def runs_dir(host: Host) -> str:
    return os.path.join(host.workdir or "~", ".rankdeck", "runs")


def laptop_runs(records: list[dict], name: str) -> list[dict]:
    """The runs this laptop recorded on host ``name``, in the record's form: a node it
    cordoned there is an incident of that run (agent/rules/fleet.py)."""
    out = []
    for rec in records:
        hosts = [h.get("name") for h in rec.get("hosts") or [] if isinstance(h, dict)]
        if name not in hosts:
            continue
        roles = rec.get("roles") or {}
        incidents = [rules.incident("cordoned", "cordoned (this laptop's record)")] \
            if roles.get(name) == "cordoned" else []
        out.append({"run_id": rec.get("run_id"), "ended": rec.get("updated") or rec.get("created"),
                    "nodes": {name: {"state": str(rec.get("state")), "incidents": incidents}}})
    return out


def row(name: str, answer: dict | None, error: str | None, laptop: list[dict]) -> dict:
    """One host's line of `rankdeck hosts`, from its answer (cleaned) and this laptop's runs."""
    if answer is None:
        judged = rules.judged(rules.merged([], laptop))
        return dict(judged, name=name, reachable=False, error=error, load=None, gpus=[],
                    strays=[])
    answer = clean_tree(answer)
    record = answer.get("record")
    host_runs = record.get("runs") if isinstance(record, dict) else None
    if not isinstance(host_runs, list):  # an agent that sends only its judgement
        host_runs = [{"run_id": r, "nodes": {}} for r in _listed(answer.get("runs"))
                     if isinstance(r, str)]
    judged = rules.judged(rules.merged(host_runs[-rules.KEEP_RUNS:], laptop))
    own = rules.judged(host_runs[-rules.KEEP_RUNS:])
    load = answer.get("load")
    return dict(judged, name=name, reachable=True, error=None,
                load=load[0] if isinstance(load, list) and load and facts.number(load[0])
                else None,
                gpus=[_gpu(g) for g in _dicts(answer.get("gpus"))],
                strays=[s for s in map(_stray, _dicts(answer.get("strays"))) if s],
                flagged=judged["flagged"] or own["flagged"] or answer.get("flagged") is True,
                incidents=judged["incidents"] or [
                    {k: str(i.get(k)) for k in ("run_id", "kind", "node", "text")}
                    for i in _dicts(answer.get("incidents"))])


def _listed(value) -> list:
    return value[:MAX_LIST] if isinstance(value, list) else []


def _dicts(value) -> list[dict]:
    """The dicts of a host's list, at most MAX_LIST: anything else is dropped."""
    return [v for v in _listed(value) if isinstance(v, dict)]


def _whole(value) -> int | None:
    return value if facts.whole(value) else None


def _gpu(g: dict) -> dict:
    """A GPU of a host's answer: its memory figures, whole numbers or None."""
    return dict(g, mem_used=_whole(g.get("mem_used")), mem_total=_whole(g.get("mem_total")))


def _stray(s: dict) -> dict | None:
    """A stray of a host's answer with the fields shown and used to stop it, each of its
    kind; None without a pid and start time (it could not be named to stop)."""
    pid, start = _whole(s.get("pid")), _whole(s.get("starttime"))
    if pid is None or start is None:
        return None
    return {"pid": pid, "starttime": start, "own": s.get("own") is True,
            "user": str(s.get("user")), "cmd": str(s.get("cmd")),
            "gpu_mem": _whole(s.get("gpu_mem"))}


async def ask_hosts(inv: Inventory, transport, history: History | None = None,
                    gpu: bool = True) -> list[dict]:
    """Every host's row (:func:`row`), in the inventory's order."""
    records = (history or History()).list(warn=lambda _text: None)
    async with RunController(inv, transport) as ctl:
        ctl.me.read_only = True
        failed = await ctl.connect_all(reconnect=False)

        async def one(h: Host):
            if h.name in failed:
                return None, "unreachable: %s" % failed[h.name]
            try:
                return await ctl.links[h.name].request("hosts", timeout=ASK_TIMEOUT,
                                                       runs_dir=runs_dir(h), gpu=gpu), None
            except (AgentError, HostUnreachable, OSError) as exc:
                return None, str(exc)
        got = await asyncio.gather(*(one(h) for h in inv.hosts))
    return [row(h.name, ans, err, laptop_runs(records, h.name))
            for h, (ans, err) in zip(inv.hosts, got)]


async def kill_strays(inv: Inventory, transport, rows: list[dict]) -> dict[str, dict]:
    """Ask each host to stop its login user's strays listed in ``rows`` (by pid and start
    time); {host: the agent's answer, or {"error": ...}}."""
    todo = {r["name"]: [[s.get("pid"), s.get("starttime")] for s in r["strays"] if s.get("own")]
            for r in rows if r["reachable"]}
    todo = {name: pids for name, pids in todo.items() if pids}
    hosts = [h for h in inv.hosts if h.name in todo]
    if not hosts:
        return {}
    async with RunController(dataclasses.replace(inv, hosts=hosts), transport) as ctl:
        failed = await ctl.connect_all(reconnect=False)

        async def one(h: Host):
            if h.name in failed:
                return {"error": "unreachable: %s" % failed[h.name]}
            try:
                return clean_tree(await ctl.links[h.name].request(
                    "kill_strays", timeout=ASK_TIMEOUT + 60, runs_dir=runs_dir(h),
                    pids=todo[h.name]))
            except (AgentError, HostUnreachable, OSError) as exc:
                return {"error": str(exc)}
        got = await asyncio.gather(*(one(h) for h in hosts))
    return {h.name: answer for h, answer in zip(hosts, got)}


def flagged_words(r: dict) -> str:
    """A flagged host's warning: its incidents, newest last, at most three."""
    seen = ["%s %s: %s" % (i.get("run_id"), i.get("kind"), i.get("text"))
            for i in r["incidents"][-3:]]
    return "%s is flagged (incidents in %d of its last %d runs): %s" % (
        r["name"], len({i.get("run_id") for i in r["incidents"]}), len(r["runs"]),
        "; ".join(seen))


def spares_for_flagged(inv: Inventory, rows: list[dict]) -> list[tuple[str, str | None]]:
    """``[(flagged active host, the spare that could take its place or None)]``: a spare
    that answered and is not flagged itself, each spare offered once, in inventory order."""
    by_name = {r["name"]: r for r in rows}
    free = [h.name for h in inv.spares if by_name.get(h.name, {}).get("reachable")
            and not by_name[h.name]["flagged"]]
    return [(h.name, free.pop(0) if free else None) for h in inv.active
            if by_name.get(h.name, {}).get("flagged")]


def swapped(inv: Inventory, pairs: list[tuple[str, str | None]]) -> Inventory:
    """``inv`` with each flagged host of ``pairs`` left out and its spare in its place."""
    out = dataclasses.replace(inv, hosts=[dataclasses.replace(h) for h in inv.hosts
                                          if h.name not in {f for f, s in pairs if s}])
    for _flagged, spare in pairs:
        if spare:
            out.host(spare).spare = False
    return out


async def ask_links(ctl) -> list[dict]:
    """Every host's row from a live run's connected links (the view's hosts screen)."""
    records = History().list(warn=lambda _text: None)

    async def one(h: Host):
        link = ctl.links.get(h.name)
        if link is None or link.stream is None:
            return None, "not connected"
        try:
            return await link.request("hosts", timeout=ASK_TIMEOUT, runs_dir=runs_dir(h)), None
        except (AgentError, HostUnreachable, OSError) as exc:
            return None, str(exc)
    hosts = list(ctl.inventory.hosts)
    got = await asyncio.gather(*(one(h) for h in hosts))
    return [row(h.name, ans, err, laptop_runs(records, h.name))
            for h, (ans, err) in zip(hosts, got)]
