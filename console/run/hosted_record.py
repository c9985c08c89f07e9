"""A run's record read from its hosts: `rankdeck watch RUN -i INVENTORY` (and `attach`) on a
laptop that did not launch the run.

At launch every node keeps the run's record, without secret values (agent/node/folder.py
``record_of``). A teammate's laptop has no record of the run; with an inventory of the same
hosts it asks them for one, checks it as it checks its own files (console/records/history.py: a host's
answer is untrusted), refuses it when it names a host the inventory does not (a Slurm run's
nodes excepted: they are reached through the inventory's login host), takes each host's
connection settings (address, SSH target, python, workdir, env) from its own inventory, and
saves the record under its own state folder, after which
every verb of a recorded run works as on the launching laptop. Secrets are never in the record:
a restart from that laptop needs them in its shell, as from any other shell (console/launch/env.py).

The hosts' run folders are private to the login that launched the run, so the teammate connects
as that login (docs/SECURITY.md, "Read-only consoles").
"""

from __future__ import annotations

import os

from inventory.addresses import HOST_NAME, addr_problem
from inventory.loader import load_inventory
from ..errors import UnknownRun
from ..records.history import History, whole_record_problem
from .run import RunController
from ..slurm import slurm
from ..transport import make_transport


async def known_or_fetched(run_id: str, inventory_path: str | None,
                            accept_new_host_keys: bool = False) -> None:
    """Make sure ``run_id`` is recorded on this laptop: as it is, or fetched from the hosts of
    ``inventory_path``; UnknownRun saying how to find it when neither works."""
    history = History()
    try:
        history.load(run_id)
        return
    except UnknownRun as err:
        if inventory_path is None:
            raise UnknownRun("%s; for a run launched from another laptop give the inventory "
                             "of its hosts: -i INVENTORY" % err) from None
    await fetch_record(run_id, inventory_path, accept_new_host_keys, history)


async def fetch_record(run_id: str, inventory_path: str, accept_new_host_keys: bool = False,
                       history: History | None = None) -> dict:
    """The record of ``run_id`` from the first host of the inventory that has it, saved in
    ``history``; UnknownRun naming what each host answered when none has it."""
    history = history or History()
    inv = load_inventory(os.path.abspath(inventory_path)).resolve_local(os.getcwd())
    answers: dict[str, str] = {}
    async with RunController(inv, make_transport(inv.transport, accept_new_host_keys),
                             history) as ctl:
        ctl.me.read_only = True  # asks and reads only; the agents refuse it any change
        failed = await ctl.connect_all(reconnect=False)
        answers.update({name: "unreachable: %s" % err for name, err in failed.items()})
        for h in inv.hosts:
            if h.name in failed:
                continue
            try:
                got = await ctl.links[h.name].request(
                    "record", run_id=run_id, runs_dir=os.path.join(h.workdir, ".rankdeck",
                                                                   "runs"), timeout=30)
            except Exception as exc:  # noqa: BLE001 (the next host may have it)
                answers[h.name] = str(exc)[:200]
                continue
            record = got.get("record") if isinstance(got, dict) else None
            problem = whole_record_problem(record)
            if problem is None and record["run_id"] != run_id:
                problem = "it is the record of run %r" % record["run_id"][:40]
            if problem:
                answers[h.name] = "its record cannot be used: %s" % problem
                continue
            try:
                record = localized(record, inv, h.name)
            except ForeignHosts as exc:
                answers[h.name] = "its record cannot be used: %s" % exc
                continue
            history.save(record)
            return record
    raise UnknownRun("run %r is not recorded on this laptop, and no host of %s has its "
                     "record:\n  %s" % (run_id, inventory_path, "\n  ".join(
                         "%s: %s" % item for item in sorted(answers.items())) or "no hosts"))


class ForeignHosts(ValueError):
    """A hosted record that names hosts this laptop's inventory does not: it is not used."""


def localized(record: dict, inv, source: str) -> dict:
    """``record`` with each host's connection settings (address, SSH target, python, workdir,
    env) from this laptop's inventory, the transport this inventory uses, and where it came
    from. ForeignHosts when the record names a host the inventory does not: a record a host
    serves is untrusted, and a host it chose, reached as it says, would run what it says at
    the next `restart` from this laptop. A Slurm run's nodes (``slurm:JOB``) are the job's:
    each is reached through the inventory's one host, the login host, with its settings; the
    record gives only their names and addresses, checked as the inventory's are
    (inventory/addresses.py)."""
    ours = {h.name: h for h in inv.hosts}
    job = slurm.job_of(record.get("transport") or "")
    if job is not None:
        if not slurm.JOB_ID.fullmatch(job):
            raise ForeignHosts("its Slurm job %r is not a job id" % job[:40])
        if len(inv.hosts) != 1:
            raise ForeignHosts("it is a Slurm run: give an inventory of one host, the login "
                               "host, as at launch --slurm")
        login = inv.hosts[0]
    foreign, hosts = [], []
    for entry in record["hosts"]:
        name, addr = entry["name"], entry["addr"]
        h = ours.get(name)
        if job is not None:  # a node of the job, reached through the login host
            if not HOST_NAME.match(name):
                raise ForeignHosts("its node %r is not a host name" % name[:40])
            if addr_problem(addr):
                raise ForeignHosts("the address %r of its node %s is not one hostname or IP "
                                   "address" % (addr[:60], name))
            h = login
        elif h is None:
            foreign.append(name)
            continue
        else:
            addr = h.addr
        hosts.append(dict(entry, addr=addr, ssh=h.ssh, python=h.python, workdir=h.workdir,
                          env={k: v.shown() for k, v in h.env.items()}))
    if foreign:
        raise ForeignHosts("it names host%s that %s does not: %s; a run is watched with an "
                           "inventory of its hosts" % (
                               "" if len(foreign) == 1 else "s", inv.path or "the inventory",
                               ", ".join(repr(n[:40]) for n in sorted(foreign)[:8])))
    transport = record.get("transport") or inv.transport
    if job is None:
        transport = inv.transport
    return dict(record, hosts=hosts, transport=transport, inventory=inv.path or None,
                copied_from=source)
