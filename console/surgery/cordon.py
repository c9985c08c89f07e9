"""Node surgery, done: cordon a node (a spare in, or the run shrinking) and uncordon it.

The plan comes first (console/surgery/surgery.py, what the preview shows); :func:`cordon` carries
out a plan that was not refused by driving the cordon sequence (agent/rules/cordon.py, the one
the run's judge drives for ``--auto-cordon`` too): this module only executes its steps over
the console's links to the nodes, each waiting for the one before:

- ``announce``: the run's judge hears of it and writes the ``surgery`` event (:func:`tell_judge`);
- ``fence``: the node's host fences it, then stops it (agent/node/fence.py ``fence``), and says
  which processes of the node are left (none, or the surgery failed);
- ``replace``: the spare starts torchrun for the same run id and rendezvous (:func:`put_in`),
  the node's dead torchrun is taken out of the rendezvous (console/surgery/expel.py) and,
  when every rank of the run was stalled (a hung node), the other nodes' workers are
  SIGKILLed (:func:`drop_workers`): they wait for the hung ranks and can save nothing, and
  their own failure would come only after their teardown, seconds later. Their torchruns
  start a new rendezvous round, which the spare joins, and every rank resumes from the
  trainer's newest checkpoint (a shrink: the round completes without it, ``--nnodes MIN:MAX``);
- ``join``: the cordon waits until the spare's ranks step (:func:`join`); one that does not is
  said (``shrank: ...``, why), never ``done``.

Every surgery is kept in the run record (``surgeries``: who, what, when, outcome) and is an
event of the run. The controller is passed in; this module imports no Textual.
"""

from __future__ import annotations

import asyncio
import time

from agent.rules import cordon as sequence
from agent.rules.judge import all_stalled
from agent.rules.rendezvous import phase_text
from ..errors import AgentError, LaunchError
from .expel import expel
from .surgery import ACTIVE, CORDONED, SPARE, CordonPlan

JOIN_EVERY = 0.5  # seconds between looks at the spare's ranks while it joins


async def cordon(ctl, plan: CordonPlan, who: str | None = None,
                 wait: float = sequence.JOIN_WAIT) -> dict:
    """Carry out ``plan`` (not refused) on the run of ``ctl`` (a connected RunController);
    the surgery's record: ``who``, ``what``, ``when``, ``outcome`` (``done``, ``shrank: why``
    or ``failed: why``), ``left`` (processes of the node still alive: none when done).
    ``wait``: seconds the spare has to step once put in."""
    if plan.refusal:
        raise ValueError("a refused plan is not carried out: %s" % plan.refusal)
    away = unreachable(ctl, plan)
    if away:
        raise ValueError(away)
    who = who or ctl.me.who  # user@laptop (console/model/consoles.py)
    kill_now = hung(ctl, plan.node)  # before the judge says its ranks left the stall
    seq = sequence.Cordon(plan.node, plan.spare, plan.shrink, plan.active_after, hung=kill_now,
                          stalled=stalled_with(ctl, plan.node) if kill_now else [], wait=wait)
    entry = {"who": who, "what": seq.what(), "when": time.time(), "node": plan.node,
             "spare": plan.spare, "outcome": "started", "left": []}
    steps = {sequence.ANNOUNCE: lambda a: tell_judge(ctl, {
                 "out": a["out"], "in": a["in"], "who": who, "action": "cordon",
                 "text": "%s: started by %s" % (a["text"], who)}),
             sequence.FENCE: lambda a: fence(ctl, plan.node, who, a["grace"], entry),
             sequence.REPLACE: lambda a: replace(ctl, plan.node, a),
             sequence.JOIN: lambda a: join(ctl, a["spare"], a["wait"])}
    while True:
        step, args = sequence.next_step(seq)
        if step == sequence.END:
            return await finish(ctl, entry, args["outcome"])
        result = await steps[step](args)
        if step == sequence.REPLACE:
            entry["expelled"] = result["expelled"]
        seq.done(step, result)


async def fence(ctl, node: str, who: str, grace, entry: dict) -> dict:
    """The sequence's ``fence`` step: ``node`` fenced and stopped on its host; the node
    leaves the run's order (its spare takes its place) once its host says it stopped."""
    link = ctl.links[node]
    began = time.monotonic()
    try:
        res = await link.request("fence", run_root=link.run_root, node=node,
                                 fence={"who": who, "why": "cordoned by %s" % who},
                                 grace=grace, timeout=ctl.stop_timeout())
    except AgentError as exc:
        return {"error": str(exc)}
    entry["fence_s"] = round(time.monotonic() - began, 2)  # the stop, confirmed
    entry["left"] = [list(p) if isinstance(p, (list, tuple)) else p
                     for p in res.get("left") or []]
    # the GPU memory of its processes (the agent's words: freed, held by..., no GPU)
    entry["gpu"] = str(res.get("gpu") or "not checked (an older agent)")[:200]
    ctl.state.set_role(node, CORDONED)  # its ranks leave the model (no stale rank of it)
    ctl.record.setdefault("roles", {})[node] = CORDONED
    # node-rank order (RunController.run_hosts): the spare takes the node's place (the
    # launchers with fixed node ranks need it there), or the run is one node shorter
    order = [h.name for h in ctl.run_hosts()]
    spare = entry.get("spare")
    if node in order:
        at = order.index(node)
        order[at:at + 1] = [spare] if spare else []
    ctl.record["order"] = order
    return {"left": entry["left"], "gpu": entry["gpu"], "member": res.get("member")}


async def replace(ctl, node: str, args: dict) -> dict:
    """The sequence's ``replace`` step: the spare starts while the other nodes' stalled
    workers are killed (their torchruns then rejoin at once rather than after their workers'
    teardown) and the node's dead torchrun is taken out of the rendezvous (the next round
    does not wait for it to expire)."""
    failed, _, expelled = await asyncio.gather(
        put_in(ctl, args["spare"]) if args["spare"] else asyncio.sleep(0),  # None: no failure
        drop_workers(ctl, args["drop"], node),
        expel(ctl, node, args["expel"]))
    return {"failed": failed, "expelled": expelled}


async def join(ctl, spare: str, wait: float) -> dict:
    """The sequence's ``join`` step: wait (``wait`` s at most) until the spare's ranks step in
    the new world, as its journal shows them to this console."""
    deadline = time.monotonic() + wait
    st = ctl.state
    while not sequence.spare_stepping(st.ranks.values(), spare):
        if time.monotonic() >= deadline:
            ns = st.nodes.get(spare)
            why = sequence.why_not_stepping(st.ranks.values(), spare, ns.state if ns else None,
                                            phase_text(ns.phase) if ns and ns.phase else None)
            held = ["%s rank %s" % (n, st.nodes[n].files[f].claim) for n, f in st.held
                    if f in st.nodes[n].files]
            return {"stepping": False, "world": st.world_size, "why": "%s; the run's ranks: %s%s"
                    % (why, ", ".join("%d on %s %s" % (r.rank, r.node, r.state)
                                      for r in sorted(st.ranks.values(), key=lambda r: r.rank)),
                       "; claims held: " + ", ".join(held[:8]) if held else "")}
        await asyncio.sleep(JOIN_EVERY)
    return {"stepping": True, "world": st.world_size}


def hung(ctl, node: str) -> bool:
    """``node``'s ranks are stalled (the judge's or this console's view): nothing of them can
    save, so its fence kills them at once instead of waiting the run's --grace."""
    return all_stalled(ctl.state.ranks_of(node))


def stalled_with(ctl, node: str) -> list[str]:
    """The run's other nodes whose workers wait for hung ``node`` in a collective: every
    rank of the run is stalled. They can save nothing either; their workers fail once the
    node is gone, after seconds of their own teardown, unless :func:`drop_workers` kills
    them first. Empty when any rank still steps (its node's workers are left alone)."""
    if not all_stalled(ctl.state.ranks.values()):
        return []
    return [h.name for h in ctl.run_hosts() if h.name != node and h.name in ctl.connected()]


async def drop_workers(ctl, nodes: list[str], node: str) -> None:
    """SIGKILL the workers of ``nodes`` (agent/node/fence.py ``drop_workers``), stalled with hung
    ``node``: each torchrun restarts its worker group in the rendezvous round that goes on
    without ``node``. One that cannot be asked is left to fail in its collective, as before."""
    async def one(name):
        link = ctl.links[name]
        try:
            res = await link.request("drop_workers", run_root=link.run_root, node=name,
                                     timeout=30)
        except AgentError as exc:
            ctl.state.add_event(name, "surgery", "%s's workers, stalled with %s, were not "
                                "killed (%s): they fail in their collective instead"
                                % (name, node, exc))
            return
        if res.get("killed"):
            ctl.state.add_event(name, "surgery", "%s's workers, stalled with %s, killed: its "
                                "torchrun starts them again without %s" % (name, node, node))
    await asyncio.gather(*(one(n) for n in nodes))


def unreachable(ctl, plan: CordonPlan) -> str | None:
    """Why ``plan`` cannot be carried out from here now: the node or the spare is not
    connected (a fence must confirm on the node's host that its processes are gone, and the
    spare must be started); nothing is done then, not even the judge told."""
    away = [n for n in (plan.node, plan.spare) if n and n not in ctl.connected()]
    if not away:
        return None
    return ("cannot reach %s: a cordon must fence the node on its host and confirm its "
            "processes are gone, and start the spare; nothing was done (`rankdeck stop RUN "
            "--node %s` once it is back, or cordon it then)" % (", ".join(away), plan.node))


async def put_in(ctl, spare: str) -> str | None:
    """Start torchrun on ``spare`` for the run (same run id, rendezvous, spec), and follow
    its journal; None, or why it did not start."""
    link = ctl.links[spare]
    ctl.state.set_role(spare, ACTIVE)
    ctl.record.setdefault("roles", {}).pop(spare, None)
    spec = ctl.node_spec(link.host, ctl.spec, ctl.record.get("rdzv_endpoint", ""))
    try:
        await ctl.hold_nodes([link.host])  # (a Slurm cgroup site's rankdeck-host step)
        res = await link.request("start", run_root=link.run_root, node=spare, spec=spec)
    except (LaunchError, AgentError) as exc:  # (its host step, its start)
        ctl.state.set_node(spare, "failed", str(exc))
        return str(exc)
    if isinstance(res, dict) and res.get("warm") is True:  # held since launch: agent/surgery/spare_hold.py
        ctl.state.add_event(spare, "surgery", "%s put in warm: its torchrun, loaded at launch, "
                            "joins the rendezvous now" % spare)
    try:
        await link.subscribe()
    except AgentError as exc:  # it runs; this console just cannot show it
        ctl.state.add_event(spare, "surgery", "%s runs, but its journal cannot be read: %s"
                            % (spare, exc))
    return None


async def uncordon(ctl, node: str, who: str | None = None) -> dict:
    """``node`` (cordoned) becomes a spare again: its fence is lifted; it starts nothing."""
    who = who or ctl.me.who  # user@laptop (console/model/consoles.py)
    entry = {"who": who, "what": "uncordon %s (a spare again)" % node, "when": time.time(),
             "node": node, "spare": None, "outcome": "started", "left": []}
    link = ctl.links[node]
    try:
        await link.request("unfence", run_root=link.run_root, node=node)
    except AgentError as exc:
        return await finish(ctl, entry, "failed: %s" % exc)
    ctl.state.set_role(node, SPARE)
    ctl.record.setdefault("roles", {})[node] = SPARE
    return await finish(ctl, entry, "done")


def uncordon_refusal(ctl, node: str) -> str | None:
    """Why ``node`` cannot be uncordoned (not a node of the run, or not cordoned)."""
    role = ctl.roles().get(node)
    if role is None:
        return "run %s has no node %r; nodes: %s" % (ctl.run_id, node, ", ".join(ctl.roles()))
    if role != CORDONED:
        return "%s is not cordoned (it is %s)" % (node, "in the run" if role == ACTIVE
                                                  else "a spare")
    return None


async def tell_judge(ctl, args: dict) -> None:
    """The run's judge hears of the surgery and writes its ``surgery`` event (every console
    shows it from the judge's journal); without a judge, this console says it."""
    node = args.get("node") or args.get("out")
    host = ctl.judge_host()
    link = ctl.links.get(host or "")
    if link is None or link.stream is None:
        ctl.state.add_event(node, "surgery", args["text"])
        return
    try:
        await link.request("judge", run_root=link.run_root, ask="cordon", args=args,
                           timeout=30)
    except AgentError as exc:
        ctl.state.add_event(node, "surgery", "%s (the judge did not hear of it: %s)"
                            % (args["text"], exc))


async def finish(ctl, entry: dict, outcome: str) -> dict:
    """The surgery's outcome: an event (through the judge), and the run record's
    ``surgeries``, saved."""
    entry["outcome"] = outcome
    gpu = "; GPU: %s" % entry["gpu"] if entry.get("gpu") else ""
    await tell_judge(ctl, {"node": entry["node"], "who": entry["who"], "action": "outcome",
                           "text": "%s: %s%s" % (entry["what"], outcome, gpu)})
    if ctl.record:
        ctl.record.setdefault("surgeries", []).append(entry)
        ctl.history.save(ctl.record)
    return entry
