"""A recorded run (the run record `launch` saved, console/records/history.py) taken up again by a
RunController (console/run/run.py ``from_record`` passes the new controller as ``ctl``): what
the record says of the run, and whether this shell can restart it.
"""

from __future__ import annotations

from ..launch import env as run_env
from ..errors import UsageError
from ..lines.sanitize import Masker
from ..launch.spec import LaunchSpec, launcher_name
from ..surgery.surgery import SPARE


def restore(ctl, record: dict) -> None:
    """``ctl`` (made for ``record``'s inventory and run id) takes what the record says of the
    run: its spec, its non-secret environment (secrets again from this shell; those missing
    kept in ``missing_env``), the nodes' roles and deep-preflight results, where its judge
    listens."""
    ctl.record = record
    ctl.state.started = record.get("created", ctl.state.started)
    # non-secret values come from the record, secrets again from this shell
    restored = run_env.restore(record, ctl.inventory)
    spec = dict(record.get("spec", {}))
    spec["env"] = restored.spec_env
    ctl.spec = LaunchSpec(**spec)
    ctl.state.flagged_hosts = set(ctl.spec.flagged or ())
    ctl.state.launcher = launcher_name(ctl.spec)
    ctl.state.nproc = ctl.spec.nproc_per_node
    ctl.missing_env = restored.missing
    ctl.secrets = sorted(set(ctl.inventory.secrets) | set(restored.secrets))
    ctl.state.masker = Masker(ctl.secrets)
    for name, role in (record.get("roles") or {}).items():
        if name in ctl.state.nodes and role in (SPARE, "cordoned"):
            ctl.state.set_role(name, role)
    health = record.get("health")
    for name, entry in (health.items() if isinstance(health, dict) else ()):
        if name in ctl.state.nodes:  # checked again: a record may come from a host
            ctl.state.set_health(name, entry)
    judge = record.get("judge") or {}
    ctl.judge_ref = {"addr": judge.get("addr"), "port": judge.get("port")} if judge else None
    ctl.state.stall_min_s = ctl.spec.stall_after


def check_restartable(ctl, node: str | None = None) -> None:
    """UsageError (exit 2) when a secret of the run is not known in this shell, so that
    ``node`` (None: every node) would restart without it; says which and how to fix it.
    Under DeepSpeed's launcher every node restarts (``ctl.static_world()``): each is checked."""
    names = [node] if node and not ctl.static_world() else [h.name for h in
                                                            ctl.inventory.hosts]
    why = []
    for name in names:
        for reason in ctl.missing_env.get(name, []):
            if reason not in why:
                why.append(reason)
    if why:
        raise UsageError("cannot restart %s of run %s: its environment is not complete in "
                         "this shell; nothing was stopped or restarted:\n  %s"
                         % (node or "the nodes", ctl.run_id, "\n  ".join(why)))
