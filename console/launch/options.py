"""The launch options checked and turned into what the run's LaunchSpec holds: ``--env``, the
script's arguments, ``--spares``, ``--nnodes``, ``--sync``, the judge's settings and Slurm's
``--signal-before``/``--requeue``. Each refuses bad input with a UsageError that names the
option and the fix, before anything is started (console/verbs/launch.py)."""

from __future__ import annotations

import os

from agent.rules.notify import KINDS as NOTIFY_KINDS
from inventory.addresses import listen_address
from inventory.model import Inventory
from ..errors import UsageError


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict; UsageError for a malformed one."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UsageError("--env %r: write KEY=VALUE with KEY a valid variable name" % item)
        env[key] = value
    return env


def script_args(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def slurm_limit(args) -> dict:
    """``--signal-before``/``--requeue`` as LaunchSpec fields; on Slurm runs only."""
    before, requeue = getattr(args, "signal_before", None), getattr(args, "requeue", False)
    if (before is not None or requeue) and not getattr(args, "slurm", None):
        raise UsageError("--signal-before and --requeue act on a Slurm job's time limit: use "
                         "them with launch --slurm or submit (docs/SLURM.md)")
    if requeue and before is None:
        before = 120.0
    # a job `submit` made (console/slurm/submit.py): the run's judge ends it with the run
    return {"signal_before": before, "requeue": requeue,
            "release_job": bool(getattr(args, "submitted", False))}


def mark_spares(inv: Inventory, names: str) -> None:
    """``launch --spares node4,node5``: those hosts of the inventory wait as spares."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in {h.name for h in inv.hosts}]
    if unknown:
        raise UsageError("--spares: no host %s in %s; hosts: %s" % (
            ", ".join(unknown), inv.path, ", ".join(h.name for h in inv.hosts)))
    inv.mark_spares(wanted)
    if not inv.active:
        raise UsageError("--spares %s leaves no host to train on" % names)


def judge_settings(args, inv: Inventory) -> dict:
    """The run's own settings the judge on the hosts applies (LaunchSpec's judge fields)."""
    kinds = None
    if getattr(args, "notify_on", None):
        kinds = [k.strip() for k in args.notify_on.split(",") if k.strip()]
        unknown = sorted(set(kinds) - set(NOTIFY_KINDS))
        if unknown:
            raise UsageError("--notify-on: unknown kind(s) %s; choose from %s"
                             % (", ".join(unknown), ", ".join(NOTIFY_KINDS)))
    prometheus = getattr(args, "prometheus", None) or getattr(inv, "prometheus", None)
    if prometheus is not None:
        try:
            listen_address(prometheus)
        except ValueError as exc:
            raise UsageError("--prometheus %s" % exc) from None
    return {"stall_after": args.stall_after or 60.0,
            "on_hang": getattr(args, "on_hang", "warn"),
            "on_nan": getattr(args, "on_nan", "warn"),
            "on_loop": getattr(args, "on_loop", "stop"),
            "loop_restarts": getattr(args, "loop_restarts", 3),
            "max_wall": getattr(args, "max_wall", None),
            "notify": getattr(args, "notify", None) or getattr(inv, "notify", None),
            "notify_on": kinds,
            "auto_cordon": bool(getattr(args, "auto_cordon", False)),
            "cordon_within": getattr(args, "cordon_within", 600.0),
            "prometheus": prometheus}


def check_nnodes(nnodes: str, hosts: int, inventory: str) -> None:
    """``--nnodes`` N or MIN:MAX must fit the inventory: rankdeck starts one node on each of
    its ``hosts`` hosts, so N must be that count, and MIN <= hosts <= MAX. UsageError with
    the fix otherwise."""
    parts = nnodes.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 2:
        raise UsageError("--nnodes %r: write N or MIN:MAX, e.g. --nnodes 2:4" % nnodes)
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise UsageError("--nnodes %s: a run needs at least 1 node" % nnodes)
    if low > high:
        raise UsageError("--nnodes %s: MIN is above MAX; write MIN:MAX, e.g. --nnodes %d:%d"
                         % (nnodes, high, low))
    where = "the inventory %s has %d host%s and rankdeck starts one node on each" % (
        inventory, hosts, "" if hosts == 1 else "s")
    if len(parts) == 1 and low != hosts:
        raise UsageError("--nnodes %s asks for %s nodes than there are hosts: %s; use "
                         "--nnodes %d, %s" % (
                             nnodes, "more" if low > hosts else "fewer", where, hosts,
                             "or add hosts to the inventory" if low > hosts else
                             "an elastic --nnodes %d:%d, or an inventory of %d hosts"
                             % (low, hosts, low)))
    if low > hosts:
        raise UsageError("--nnodes %s needs at least %d nodes, more than there are hosts: %s; "
                         "use --nnodes %d:%d or add hosts to the inventory"
                         % (nnodes, low, where, min(hosts, high), max(hosts, high)))
    if hosts > high:
        raise UsageError("--nnodes %s allows at most %d nodes, fewer than there are hosts: %s; "
                         "use --nnodes %d:%d or an inventory of %d hosts"
                         % (nnodes, high, where, low, hosts, high))


def sync_folder(given: str | None, from_inventory: str | None, inventory: str) -> str | None:
    """The folder to send (``--sync DIR``, else the inventory's ``defaults.sync``), absolute;
    UsageError when it is not a folder on this machine."""
    folder = given or from_inventory
    if folder is None:
        return None
    folder = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(folder):
        said = "--sync %s" % given if given else "defaults.sync in %s (%s)" % (inventory, folder)
        raise UsageError("%s: not a folder on this machine; give the folder that holds your "
                         "training code" % said)
    return folder
