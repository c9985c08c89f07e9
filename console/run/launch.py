"""Launching a run, for the RunController (console/run/run.py, which passes itself as ``ctl``):
connect to every host at once, send the code (``--sync DIR``, console/launch/sync.py), check the
hosts (preflight), start the rendezvous store on the store's host and the run's judge beside
it, start a supervisor (and so torchrun) on every host, subscribe to every node's journal. A
run is never started on only some of the hosts: if any host cannot be reached, synced or
started, nothing is started or what was started is stopped, and :func:`_launch_failed` says
what a failed launch leaves. Each node's start spec is :func:`node_spec`'s.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import asdict

from inventory.model import Host
from ..launch import env as run_env
from ..slurm import slurm
from ..surgery.autocordon import keep_spare_spec, warm_spares
from ..errors import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, AgentError, LaunchError
from ..records.history import host_record
from . import deep
from .link import NodeLink
from .preflight import HostCheck, check_table, run_preflight
from ..lines.sanitize import secret_warnings
from ..launch.spec import LaunchSpec, launcher_name, node_commands, run_root
from ..surgery.surgery import SPARE, store_host
from ..launch.sync import Manifest, SyncError, build_manifest, progress_line, sync_hosts


def node_spec(ctl, host: Host, spec: LaunchSpec, endpoint: str,
              hosts: list[Host] | None = None) -> dict:
    """``host``'s start spec; ``hosts``: the run's in node-rank order (default: now's)."""
    cmd = node_commands(hosts or ctl.run_hosts(), spec, ctl.run_id, endpoint,
                        lambda h: ctl.root_of(h.name))[host.name]
    env = {k: v.value for k, v in host.env.items()}
    env.update(cmd.env)  # the launcher's (console/launch/launchers.py); the user's --env wins
    env.update(spec.env)
    return {
        "run_id": ctl.run_id,
        "node": host.name,
        "argv": cmd.argv,
        "hostfile": cmd.hostfile,
        "cwd": host.workdir,
        "env": env,
        # masked in causes: the host's secrets, and an --env value replacing any secret
        "secret_env": sorted({k for k, v in host.env.items() if v.secret} |
                             (set(spec.env) & run_env.secret_names(ctl.inventory))),
        # and each ${VAR} filled into a secret value (`Bearer ${TOKEN}`): printed alone
        "secret_parts": sorted({p for v in host.env.values() if v.secret for p in v.parts}),
        "grace": spec.grace,
        "launcher": launcher_name(spec),  # named in the node's causes and phases
        "max_restarts": spec.max_restarts,
        "metrics_regex": spec.metrics_regex,
        "checkpoint_dir": spec.checkpoint_dir,
        # where the run's judge listens; its token only from the console that made it (a
        # later console's restart: the host kept it, agent/wire/judge.py)
        "judge": ctl.judge_ref,
        # before the Slurm job's time limit (agent/slurm/job.py): the first node requeues
        "slurm_limit": {"signal_before": spec.signal_before, "requeue": spec.requeue,
                        "requeuer": host.name == ctl.run_hosts()[0].name}
        if spec.signal_before is not None else None,
    }


async def launch(ctl, spec: LaunchSpec, allow_partial: bool = False,
                 inventory_path: str = "", preflight: bool = True) -> str:
    """Start ``spec`` on every host (``allow_partial``: on those that can be reached);
    the run id. LaunchError (its exit code, each host's cause) when it cannot: see
    :func:`_launch_failed` for what a failed launch leaves."""
    try:
        return await _launch(ctl, spec, allow_partial, inventory_path, preflight)
    except LaunchError as exc:
        await _launch_failed(ctl, exc)
        raise
    except Exception as exc:  # a bug or a transport's unexpected error: still a failure
        ctl.launch_error = LaunchError(str(exc), EXIT_FAILED)
        raise


async def _launch_failed(ctl, exc: LaunchError) -> None:
    """What every failed launch leaves, whichever view shows it: the error (the exit
    code), each node it names marked failed with its cause (unless the node says why
    already: unreachable, sync or preflight failed), a saved run record saying
    ``failed``, and every link closed (what was started has been stopped)."""
    ctl.launch_error = exc
    for node, cause in exc.causes.items():
        ns = ctl.state.nodes.get(node)
        if ns is not None and ns.state != "unreachable" and not ns.state.endswith("failed"):
            ctl.state.set_node(node, "failed", str(cause))
    if ctl.record:
        ctl.record["state"] = "failed"
        ctl.history.save(ctl.record)
    await ctl.close()


async def _launch(ctl, spec: LaunchSpec, allow_partial: bool, inventory_path: str,
                  preflight: bool) -> str:
    ctl.state.started = time.time()
    ctl.spec = spec
    ctl.state.flagged_hosts = set(spec.flagged or ())
    ctl.state.nproc = spec.nproc_per_node  # bounds what a node may claim (ownership.py)
    ctl.state.launcher = launcher_name(spec)
    ctl.mask_env_secrets(spec.env)
    for warning in secret_warnings(ctl.secrets):
        ctl.state.add_event(None, "warning", warning)
    for ns in ctl.state.nodes.values():
        ns.max_restarts = spec.max_restarts
    # listed and hashed while the connections open (a thread: it reads every file)
    listing = asyncio.ensure_future(asyncio.to_thread(
        build_manifest, spec.sync, True, spec.sync_include)) if spec.sync else None
    failed = await ctl.connect_all()
    if failed and not allow_partial:
        if listing is not None:
            listing.cancel()
        raise LaunchError("cannot reach %d of %d hosts; nothing was started:\n%s" % (
            len(failed), len(ctl.inventory.hosts),
            "\n".join(cause_line(n, e) for n, e in failed.items())), EXIT_UNREACHABLE,
            failed)
    hosts = [h for h in ctl.inventory.hosts if h.name not in failed]
    if not any(not h.spare for h in hosts):
        raise LaunchError("only spares can be reached; nothing was started", EXIT_UNREACHABLE,
                          failed)
    # where the store and judge survive the cordon of any node (console/surgery/surgery.py)
    rdzv = store_host(ctl.inventory, hosts)
    active = [h for h in hosts if not h.spare]
    synced = await _launch_sync(ctl, hosts, listing) if listing is not None else None
    if preflight == "deep":  # a suspect node left out, a spare in (console/run/deep.py)
        hosts = await deep.launch_preflight(ctl, [rdzv] + [h for h in hosts if h is not rdzv],
                                            spec, tree=(synced or {}).get("tree"))
        rdzv = store_host(ctl.inventory, hosts)
        active = [h for h in hosts if not h.spare]
    elif preflight:  # the store's host first: preflight probes the rendezvous from it
        await _launch_preflight(ctl, [rdzv] + [h for h in hosts if h is not rdzv], spec)
    ctl.record = {
        "run_id": ctl.run_id, "created": time.time(), "inventory": inventory_path,
        "transport": ctl.inventory.transport, "hosts": [host_record(h) for h in hosts],
        "run_roots": {h.name: run_root(h, ctl.run_id) for h in hosts},
        "rdzv_host": rdzv.name, "spec": asdict(spec), "state": "starting",
        "sync": synced, "nnodes": str(len(active)),
        "order": [h.name for h in active],  # node-rank order (run_hosts)
        # spares and cordoned nodes (docs/SURGERY.md); surgeries: who did what, when
        "roles": {h.name: SPARE for h in hosts if h.spare}, "surgeries": [],
        # each node's deep preflight (console/model/health.py), a node left out included
        "health": {ns.name: ns.health for ns in ctl.state.nodes.values() if ns.health},
    }
    # what a restart from another shell needs (console/launch/env.py): secrets by name only
    ctl.record["spec"]["env"], ctl.record["secret_env"] = run_env.spec_env_record(
        spec.env, ctl.inventory)
    ctl.history.save(ctl.record)
    for h in active:
        ctl.state.set_node(h.name, "starting")
    await ctl.hold_nodes(hosts)
    store_link = ctl.links[rdzv.name]
    try:  # answered once its port is bound: the nodes start while the store's torch loads
        store = await store_link.request(
            "store_start", run_root=ctl.root_of(rdzv.name), addr=rdzv.addr,
            python=rdzv.python or sys.executable, early=True, timeout=180)
    except AgentError as exc:
        raise LaunchError("%s: could not start the rendezvous store: %s"
                          % (rdzv.name, exc), EXIT_FAILED) from None
    endpoint = "%s:%d" % (rdzv.addr, store["port"])
    ctl.record["rdzv_endpoint"] = endpoint
    await ctl.start_judge(rdzv, active, spec)
    if spec.auto_cordon and ctl.judge_ref and rdzv.spare:
        await keep_spare_spec(ctl, rdzv, spec, endpoint)
    # each node keeps the record (no secret values): what `watch RUN -i` on another
    # laptop reads (console/run/hosted_record.py)
    started = await ctl.gather_nodes(
        lambda link: link.request("start", run_root=link.run_root, node=link.name,
                                  spec=node_spec(ctl, link.host, spec, endpoint),
                                  record=ctl.record),
        [h.name for h in active])
    bad = {n: r for n, r in started.items() if isinstance(r, BaseException)}
    if not bad:
        try:
            store = await store_link.request("store_wait", run_root=ctl.root_of(rdzv.name),
                                             wait=170, timeout=180)
        except AgentError as exc:
            bad = {rdzv.name: exc}  # its words name the store
    if bad:
        await ctl.gather_nodes(lambda link: link.request(
            "stop", run_root=link.run_root, node=link.name),
            [n for n, r in started.items() if not isinstance(r, BaseException)])
        await store_link.request("store_stop", run_root=ctl.root_of(rdzv.name))
        raise LaunchError("could not start on %s; the run was stopped:\n%s" % (
            ", ".join(bad), "\n".join(cause_line(n, e) for n, e in bad.items())),
            EXIT_FAILED, bad)
    ctl.state.add_event(rdzv.name, "rendezvous", "rendezvous store at %s%s" % (
        endpoint, "; " + store["note"][:300] if store.get("note") else ""))
    await warm_spares(ctl, spec, endpoint, bool(slurm.job_of(ctl.inventory.transport or "")))
    ctl.history.save(ctl.record)
    await ctl.subscribe_all()
    return ctl.run_id


async def _launch_sync(ctl, hosts: list[Host], listing: asyncio.Future) -> dict:
    """Send the ``--sync`` tree into every host's workdir; returns what the run record
    keeps of it (its tree hash). LaunchError, nothing started, when the tree cannot be
    listed (exit 2) or any host fails to take it (that host's cause)."""
    try:
        manifest: Manifest = await listing
    except SyncError as exc:
        raise LaunchError("--sync: %s; nothing was started" % exc, EXIT_USAGE) from None
    for h in hosts:
        ctl.state.set_node(h.name, "syncing")
    for path, why in manifest.skipped:
        ctl.state.add_event(None, "sync", "sync: %s: %s" % (path, why))
    last: dict = {}

    def report(progress: dict, final: bool = False) -> None:
        last.update(progress)
        line = progress_line(progress)
        for listener in list(ctl.sync_listeners):
            listener(line, final)

    def caller(link: NodeLink):
        def call(op: str, args: dict):
            if op == "sync_commit":  # kept in the node's action log (agent/host/actions.py)
                args = dict(args, run_root=link.run_root, node=link.name)
            return link.request(op, timeout=300, **args)
        return call

    results = await sync_hosts({h.name: caller(ctl.links[h.name]) for h in hosts},
                               manifest, {h.name: h.workdir for h in hosts}, report)
    report(last, True)
    bad = {}
    for name, res in results.items():
        if isinstance(res, (AgentError, SyncError, OSError)):
            bad[name] = res
            ctl.state.set_node(name, "sync failed", "sync: %s" % res)
        elif isinstance(res, BaseException):
            raise res  # a bug, not a host's answer
        else:
            ctl.state.add_event(name, "sync", "code %s: tree %s in %s" % (
                "unchanged" if res.same else "synced (%d file(s), %.1f MB sent)" % (
                    res.files_sent, res.bytes_sent / 1e6), manifest.tree[:12],
                res.workdir))
    if bad:
        raise LaunchError("could not send %s to %d of %d hosts; nothing was started:\n%s"
                          % (manifest.root, len(bad), len(hosts),
                             "\n".join(cause_line(n, e) for n, e in bad.items())),
                          EXIT_FAILED, bad)
    return {"tree": manifest.tree, "dir": manifest.root, "files": len(manifest.entries),
            "bytes": manifest.bytes, "source": manifest.source}


async def preflight(ctl, hosts: list[Host] | None = None, failed: dict | None = None,
                    spec: LaunchSpec | None = None, **deep) -> list[HostCheck]:
    """Check ``hosts`` (default: every host; the first is the rendezvous host) over their
    connected links; ``failed``: {host: error} of those that could not be reached.
    ``spec``: also check that its script (or module) is on every host. ``deep``: the deep
    check's facts (console/run/deep.py)."""
    hosts = list(hosts or ctl.inventory.hosts)
    script = spec.script if spec is not None and not spec.launcher else None
    ctl.preflight_checks = await run_preflight(
        ctl.links, {h.name: h for h in hosts}, failed or {}, hosts[0].name,
        script=script, module=bool(spec and spec.module), launching=spec is not None, **deep)
    return ctl.preflight_checks


async def _launch_preflight(ctl, hosts: list[Host], spec: LaunchSpec) -> None:
    """Preflight before a launch, shown per node; LaunchError if any host has a problem
    (exit 2 when one is a mistake in the inventory or run spec, like a missing script)."""
    for h in hosts:
        ctl.state.set_node(h.name, "preflight")
    checks = await preflight(ctl, hosts, spec=spec)
    for c in checks:
        if c.ok:
            ctl.state.add_event(c.name, "preflight", "preflight ok (torch %s, %d GPU(s))"
                                % (c.facts.get("torch"), len(c.facts.get("gpus") or [])))
        else:
            ctl.state.set_node(c.name, "preflight failed", "; ".join(c.problems))
    if not all(c.ok for c in checks):
        raise LaunchError("preflight found problems; nothing was started (rankdeck launch "
                          "--skip-preflight starts anyway):\n%s" % check_table(checks),
                          EXIT_USAGE if any(c.bad_input for c in checks) else EXIT_FAILED,
                          {c.name: "; ".join(c.problems) for c in checks if not c.ok})


def cause_line(name: str, exc: BaseException) -> str:
    """``  node1: no-python: python '/x' not found; ...`` (one host's failure, one line)."""
    cause = getattr(exc, "cause", None) or getattr(exc, "kind", None) or "error"
    msg = str(exc)
    if msg.startswith(name + ":"):
        msg = msg[len(name) + 1:].lstrip()
    return "  %s: %s: %s" % (name, cause, msg)
