"""Controlling a run, for the RunController (console/run/run.py, which passes itself as ``ctl``):
stop and restart nodes (a static world's restart on a fresh store), what holds a Slurm
site's processes, whether a restart must wait for a rendezvous, a cordon's plan, and the
requests the views make of the nodes (every rank's stack, older log lines).
"""

from __future__ import annotations

import asyncio
import sys
import time

from inventory.model import Host
from ..model import rendezvous
from ..model.state import ended_run_state
from ..surgery.autocordon import spares_running
from ..errors import EXIT_FAILED, AgentError, LaunchError
from ..surgery.expel import expel
from .link import NodeLink
from ..launch.spec import STATIC_WORLD
from ..surgery.surgery import ACTIVE, SPARE, CordonPlan, plan_cordon


async def stop(ctl, node: str | None = None) -> dict:
    """Stop one node or, without ``node``, every node (not the spares, which never
    started) and the rendezvous store; {node: the agent's answer or its error}."""
    names = [node] if node else ctl.in_run() + await spares_running(ctl)
    results = await ctl.gather_nodes(
        lambda link: link.request("stop", run_root=link.run_root, node=link.name,
                                  timeout=ctl.stop_timeout()), names)
    if node is None:
        await stop_store(ctl)
        record_end(ctl, results)
    return results


def record_end(ctl, results: dict) -> None:
    """After the whole run's stop, its record says how it ended (`rankdeck ls`), from what
    every active node answered, without waiting for a console to replay its journals; the
    status saved last is kept. A node out of reach or still alive leaves the record as it was."""
    if not ctl.record:
        return
    states = []
    for name, role in ctl.roles().items():
        res = results.get(name)
        if role == ACTIVE:
            if not isinstance(res, dict):
                return
            states.append(res.get("state"))
    ended = ended_run_state(states)
    if ended and states:
        ctl.record["state"] = ended
        ctl.history.save(ctl.record)


async def stop_store(ctl) -> None:
    """The run is over: end its rendezvous store and its judge (which says how the run
    ended and sends its last notifications first)."""
    for op, host in (("store_stop", ctl.record.get("rdzv_host")),
                     ("judge_stop", ctl.judge_host())):
        if host and host in ctl.links and ctl.links[host].stream is not None:
            try:
                await ctl.links[host].request(op, run_root=ctl.root_of(host))
            except AgentError:
                pass


async def restart(ctl, node: str | None = None) -> dict:
    """Restart one node (it rejoins the rendezvous) or, without ``node``, every node.
    Under a static world (``ctl.static_world()``) every node, on a fresh store's port."""
    ctl.check_restartable(node)
    names = [node] if node else [n for n, r in ctl.roles().items()
                                 if r == ACTIVE and n in ctl.links]
    if node is not None and ctl.roles().get(node, ACTIVE) != ACTIVE:
        why = ("%s is cordoned: rankdeck never restarts it (`rankdeck uncordon` makes it a "
               "spare)" if ctl.roles()[node] != SPARE else
               "%s is a spare: `rankdeck cordon --replace-with` puts it in") % node
        ctl.state.add_event(node, "refused", why)
        return {node: AgentError(why, "refused")}
    static = ctl.static_world()
    if static:
        names = [n for n, r in ctl.roles().items() if r == ACTIVE and n in ctl.links]
    refusal = await restart_refusal(ctl, names)
    if refusal:  # nothing was touched: every node answers with the reason
        ctl.state.add_event(node, "refused", refusal)
        return {n: AgentError(refusal, "refused") for n in names}
    endpoint, port = ctl.record.get("rdzv_endpoint", ""), None
    if static:
        try:
            endpoint = await _fresh_store(ctl)
        except AgentError as exc:
            ctl.state.add_event(None, "refused", str(exc))
            return {n: exc for n in names}
        port = int(endpoint.rpartition(":")[2])
        ctl.state.add_event(None, "restarting", "%s (master port %d)" % (static, port))
    for n in names:
        ctl.state.set_node(n, "restarting")
        ctl.state.add_event(n, "restarting", "restart requested from the console")

    try:  # a supervisor the restart starts again lives in it (a Slurm cgroup site)
        await hold_nodes(ctl, [ctl.inventory.host(n) for n in names])
    except LaunchError as exc:
        return {n: AgentError(str(exc), "refused") for n in names}

    def req(link: NodeLink):
        spec = ctl.node_spec(link.host, ctl.spec, endpoint)
        extra = {"master_port": port} if port is not None else {}
        return link.request("restart", run_root=link.run_root, node=link.name, spec=spec,
                            timeout=ctl.stop_timeout(), **extra)
    said = await ctl.gather_nodes(req, names)
    # each old torchrun, gone now, out of the rendezvous: the new ones' round need not
    # wait for its entry to expire (console/surgery/expel.py)
    await asyncio.gather(*(expel(ctl, n, r.get("member")) for n, r in said.items()
                           if isinstance(r, dict) and isinstance(r.get("member"), dict)))
    return said


async def hold_nodes(ctl, hosts: list[Host]) -> None:
    """What holds the run's processes on ``hosts`` beyond this console (a Slurm site's
    rankdeck-host step: console/transport/slurm.py); LaunchError when it cannot."""
    hold = getattr(ctl.transport, "hold_nodes", None)
    if hold is None:
        return

    async def ask_up(names):
        said = await ctl.gather_nodes(lambda link: link.request("host_up"), names)
        return {n for n, r in said.items() if isinstance(r, dict) and r.get("up")}
    try:
        await hold(hosts, ask_up)
    except RuntimeError as exc:
        raise LaunchError("%s; nothing was started" % exc, EXIT_FAILED) from None


async def _fresh_store(ctl) -> str:
    """A static world's restart: the rendezvous host's store stopped and started again on
    a port it picks (agent/surgery/static_world.py); the new endpoint, kept in the run record.
    AgentError (nothing else touched) when that host cannot do it."""
    host = ctl.inventory.host(ctl.record["rdzv_host"])
    link = ctl.links.get(host.name)
    if link is None or link.stream is None:
        raise AgentError("%s (the rendezvous host) is not connected: the store cannot start "
                         "again; no node was restarted" % host.name, "closed")
    store = await link.request("store_start", run_root=ctl.root_of(host.name),
                               addr=host.addr, python=host.python or sys.executable,
                               fresh=True, timeout=180)
    endpoint = "%s:%d" % (host.addr, store["port"])
    if not store.get("fresh"):  # an agent without fresh stores answers with the running one
        raise AgentError("%s: the store did not start again on a new port; no node was "
                         "restarted" % host.name, "refused")
    ctl.record["rdzv_endpoint"] = endpoint
    ctl.history.save(ctl.record)
    return endpoint


def cordon_plan(ctl, node: str, replace_with: str | None = None) -> CordonPlan:
    """What cordoning ``node`` would do now (console/surgery/surgery.py); console/surgery/cordon.py does it."""
    nnodes = (ctl.spec.nnodes if ctl.spec is not None else None) or ctl.record.get("nnodes")
    launcher = ctl.spec.launch_with if ctl.spec is not None else None
    return plan_cordon(ctl.state, ctl.inventory, nnodes, node, replace_with,
                       ctl.record.get("rdzv_host"), STATIC_WORLD.get(launcher))


async def restart_refusal(ctl, names: list[str]) -> str | None:
    """Why restarting ``names`` now must wait (a rendezvous under way: console/model/rendezvous.py),
    judged on every node's state as its agent says it now; None: go ahead."""
    # the run's nodes: a spare (a warm one's torchrun waits before the rendezvous) and a
    # cordoned node are in no rendezvous of it
    active = {n: ns for n, ns in ctl.state.nodes.items() if ns.role == ACTIVE}
    states = await ctl.gather_nodes(lambda link: link.request(
        "state", run_root=link.run_root, node=link.name, timeout=30),
        [n for n in active if n in ctl.links])
    for name, st in states.items():
        if isinstance(st, dict):
            ctl.state.apply_supervisor_state(name, st)
    return rendezvous.restart_refusal(active, list(ctl.state.ranks.values()),
                                      names, time.time(), ctl.state.stall_min_s)


async def stacks(ctl, names: list[str] | None = None) -> dict:
    """Every rank's Python stack on the named nodes: {node: {"ranks": [...]}}."""
    return await ctl.gather_nodes(
        lambda link: link.request("stacks", run_root=link.run_root, node=link.name,
                                  python=link.host.python or sys.executable, timeout=60),
        names)


async def scrollback(ctl, node: str, files: list[int], before: int,
                     since: int = 0) -> tuple[list, int]:
    """Log records of ``files`` on ``node`` from before journal offset ``before`` (and not
    before ``since``): a page of older lines than the console keeps (console/model/scrollback.py)."""
    link = ctl.links.get(node)
    if link is None:
        raise AgentError("%s: not connected" % node, "closed")
    data = await link.request("scrollback", run_root=link.run_root, node=node, files=files,
                              before=before, since=since, bytes=ctl.page_bytes,
                              timeout=30)
    return data["recs"], int(data["start"])
