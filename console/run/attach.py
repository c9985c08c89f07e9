"""Following a run, for the RunController (console/run/run.py, which passes itself as ``ctl``):
subscribe to every node's journal and the judge's (after a launch, or to attach to a run
going on), a TUI's attach that reads only the recent log lines, waiting until every journal
has been replayed (``caught_up``), and a Slurm run's job followed for the header.
"""

from __future__ import annotations

import asyncio
import time

from ..slurm import slurm
from ..errors import AgentError
from .link import NodeLink

ATTACH_BACKLOG = 4 << 20  # journal bytes per node a TUI attach reads log lines from
JOB_EVERY_S = 30.0  # how often an attached console asks squeue for a Slurm run's job


async def recent_lines_only(ctl, keep: int = ATTACH_BACKLOG) -> None:
    """Before subscribing: take only the last ``keep`` bytes of each node's journal as log
    lines (metrics, checkpoints and events still come from the start). What a TUI needs to
    attach to a run of many hours at once; older lines are fetched on scrolling back."""
    async def one(link: NodeLink):
        st = await link.request("state", run_root=link.run_root, node=link.name)
        link.quiet_until = max(link.quiet_until, int(st.get("journal_size") or 0) - keep)
        # now, not only at subscribe(): the panes take their floors from it when shown
        ctl.state.nodes[link.name].data_from = link.quiet_until

    await ctl.gather_nodes(one, ctl.connected())


async def subscribe_all(ctl) -> None:
    """Follow the run: every node's journal, the judge's, and the controller's rounds
    (console/run/housekeeping.py); a Slurm run's job too."""
    # a spare has no journal until it is put in (console/surgery/cordon.py subscribes it then)
    await ctl.gather_nodes(lambda link: link.subscribe(),
                           [n for n in ctl.connected() if n in ctl.in_run()])
    await _subscribe_judge(ctl)
    ctl.tasks.append(asyncio.ensure_future(ctl.housekeeping.run()))
    job = slurm.job_of(ctl.inventory.transport or "")
    if job:
        ctl.tasks.append(asyncio.ensure_future(
            _follow_job(ctl.state, ctl.transport, ctl.inventory.hosts, job)))


async def _subscribe_judge(ctl) -> None:
    host = ctl.judge_host()
    link = ctl.links.get(host) if host else None
    if link is None or link.stream is None:
        return
    try:
        await link.subscribe_judge()
    except AgentError as exc:
        ctl.state.add_event(host, "judge", "the judge's journal cannot be read (%s): this "
                            "console judges the run" % exc)


async def caught_up(ctl, timeout: float = 60.0) -> None:
    """Wait until every connected node's journal has been replayed to its current end and
    its state.json has arrived (or ``timeout`` passed: a node that stopped sending is not
    waited for longer). The state comes after the journal is drained: `status` printed
    before it would show the node's torchrun phase as unknown."""
    async def one(link: NodeLink):
        st = await link.request("state", run_root=link.run_root, node=link.name)
        size = st.get("journal_size")
        if size is None:
            return
        node = ctl.state.nodes[link.name]
        has_state = st.get("state") != "missing"  # no state.json: no state message comes
        try:
            # (a journal its agent can read no further, stream_end: as far as it goes)
            await asyncio.wait_for(ctl.until(
                lambda: (node.journal_offset >= size or node.stream_end is not None)
                and (node.state_seen or not has_state)), timeout)
        except asyncio.TimeoutError:
            pass
        if not has_state and st.get("procs") == 0:
            gone(ctl, link.name, st)
    # the nodes this console follows: a spare's journal (a warm spare's held torchrun) is
    # not read until it is put in, and waiting for it would wait the whole timeout
    followed = [n for n in ctl.connected() if ctl.links[n].subscribed]
    if followed:
        await ctl.gather_nodes(one, followed)
    judge = ctl.links.get(ctl.judge_host() or "")
    if judge is not None and judge.judge_subscribed:
        st = await judge.request("state", run_root=judge.run_root, node="judge")
        size = st.get("journal_size") or 0
        try:
            await asyncio.wait_for(ctl.until(
                lambda: ctl.state.judge_offset >= size or "judge" in judge.stream_ends),
                timeout)
        except asyncio.TimeoutError:
            pass


def gone(ctl, name: str, st: dict) -> None:
    """Node ``name``'s agent can read no state of it and no process of it runs on its host
    (``st``: its ``state`` answer): nothing of the node is left to say how it ended, so it is
    ``gone`` (not the ``starting`` or ``running`` it was last seen as), with what is known."""
    ns = ctl.state.nodes[name]
    if ns.ended or ns.state in ("lost", "gone") or ns.role != "active":
        return
    where = "%s/%s" % (ctl.root_of(name), name)
    known = ("its run folder %s is not on its host any more" % where if not st.get("folder")
             else "its state.json in %s cannot be read" % where)
    last = {n.get("name"): n for n in (ctl.record.get("status") or {}).get("nodes") or []
            if isinstance(n, dict)}.get(name) or {}
    seen = ctl.record.get("updated")
    cause = "nothing of it is left: no process of it runs, and " + known
    if last.get("state") == "gone" and isinstance(last.get("cause"), str):
        cause = last["cause"]  # an earlier `status` said so: what it knew then stays
    elif isinstance(last.get("state"), str) and isinstance(seen, (int, float)):
        cause += "; last seen %s at %s" % (last["state"][:40], time.strftime(
            "%Y-%m-%d %H:%M:%S", time.localtime(seen)))
    ctl.state.set_node(name, "gone", cause)
    ctl.state.add_event(name, "gone", ns.cause or "")


async def _follow_job(state, transport, hosts: list, job: str) -> None:
    """A Slurm run's job now (state, time left) in ``state.slurm``, for the header, and
    the nodes Slurm has drained, down or failing (``nodes``), for the nodes table."""
    while True:
        now, words = await slurm.job_and_nodes(transport, hosts, job)
        state.set_slurm(dict(now, at=time.time(), nodes=words))
        await asyncio.sleep(JOB_EVERY_S)
