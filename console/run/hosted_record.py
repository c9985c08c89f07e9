"""A run's record read from its hosts: `rankdeck watch RUN -i INVENTORY` (and `attach`) on a
laptop that did not launch the run.

At launch every node keeps the run's record, without secret values (agent/node/folder.py
``record_of``). A teammate's laptop has no record of the run; with an inventory of the same
hosts it asks them for one, checks it as it checks its own files (console/records/history.py: a host's
answer is untrusted), takes each host's connection settings (address, SSH target, python,
workdir) from its own inventory, and saves the record under its own state folder, after which
every verb of a recorded run works as on the launching laptop. Secrets are never in the record:
a restart from that laptop needs them in its shell, as from any other shell (console/launch/env.py).

The hosts' run folders are private to the login that launched the run, so the teammate connects
as that login (docs/SECURITY.md, "Read-only consoles").
"""

from __future__ import annotations

import os

from inventory.loader import load_inventory
from ..errors import UnknownRun
from ..records.history import History, whole_record_problem
from .run import RunController
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
            record = localized(record, inv, h.name)
            history.save(record)
            return record
    raise UnknownRun("run %r is not recorded on this laptop, and no host of %s has its "
                     "record:\n  %s" % (run_id, inventory_path, "\n  ".join(
                         "%s: %s" % item for item in sorted(answers.items())) or "no hosts"))


def localized(record: dict, inv, source: str) -> dict:
    """``record`` with each host's connection settings from this laptop's inventory (a host
    the inventory does not name keeps the launcher's), the transport this inventory uses, and
    where it came from."""
    ours = {h.name: h for h in inv.hosts}
    hosts = []
    for entry in record["hosts"]:
        h = ours.get(entry.get("name"))
        if h is not None:
            entry = dict(entry, addr=h.addr, ssh=h.ssh, python=h.python, workdir=h.workdir)
        hosts.append(entry)
    transport = record.get("transport") or inv.transport
    if not transport.startswith("slurm:"):
        transport = inv.transport
    return dict(record, hosts=hosts, transport=transport, inventory=inv.path or None,
                copied_from=source)
