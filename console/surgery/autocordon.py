"""Node surgery the run's judge does itself, ``launch --auto-cordon`` (docs/SURGERY.md), from
the console's side: the spare's start spec handed to the judge's host at launch, and the
judge's surgeries (console/judgement/judged.py) kept in the run record, the spare put in followed; the
warm spares started at launch, and the spares that run (held or put in) for a stop.
The controller is passed in (console/run/launch.py, run_control.py and run_housekeeping.py call
these); this module imports no Textual.
"""

from __future__ import annotations

from ..errors import AgentError
from .surgery import ACTIVE, CORDONED, SPARE


async def follow_judge(ctl) -> None:
    """Surgeries the judge did itself (``--auto-cordon``, console/judgement/judged.py): into the run
    record (roles, node-rank order, ``surgeries``), the spare it put in followed here; a node
    it could not fence on its host (its supervisor had ended) is fenced from this console."""
    done = ctl.state.judge_surgeries[ctl.judge_surgeries_seen:]
    if not done or not ctl.record or ctl.me.read_only:
        return
    ctl.judge_surgeries_seen += len(done)
    for entry in done:
        node, spare = entry["node"], entry["spare"]
        if any(s.get("who") == "judge" and s.get("when") == entry["when"]
               for s in ctl.record.setdefault("surgeries", [])):
            continue  # recorded by a console before this one
        ctl.record["surgeries"].append(entry)
        if ctl.roles().get(node) == CORDONED:
            ctl.record.setdefault("roles", {})[node] = CORDONED
            order = [h.name for h in ctl.run_hosts()]
            if node in order:
                at = order.index(node)
                order[at:at + 1] = [spare] if ctl.roles().get(spare) == ACTIVE else []
            ctl.record["order"] = order
        link = ctl.links.get(node)
        if entry["outcome"] == "done, not fenced" and link is not None and link.stream:
            try:
                await link.request("fence", run_root=link.run_root, node=node, fence={
                    "who": ctl.me.who, "why": "cordoned by the judge (--auto-cordon)"})
            except AgentError as exc:
                ctl.state.add_event(node, "surgery", "%s could not be fenced: %s" % (node, exc))
        if spare and ctl.roles().get(spare) == ACTIVE:
            ctl.record.setdefault("roles", {}).pop(spare, None)
            link = ctl.links.get(spare)
            if link is not None and link.stream is not None and not link.subscribed:
                try:
                    await link.subscribe()
                except AgentError as exc:
                    ctl.state.add_event(spare, "surgery", "%s runs, but its journal cannot be "
                                        "read: %s" % (spare, exc))
    ctl.history.save(ctl.record)


async def keep_spare_spec(ctl, spare, spec, endpoint: str) -> None:
    """``launch --auto-cordon``: the start spec of ``spare`` (a Host: the one the judge lives
    on, the only spare it can start) goes to its host (agent/node/fence.py ``standby``, 0600), so
    the judge can put it in with no console (agent/judge/cordon.py). It takes the last node's
    place in the node-rank order: torchrun's rendezvous numbers the nodes itself."""
    order = ctl.run_hosts()
    link = ctl.links[spare.name]
    try:
        await link.request("standby", run_root=link.run_root, node=spare.name,
                           spec=ctl.node_spec(spare, spec, endpoint, order[:-1] + [spare]))
    except AgentError as exc:
        ctl.state.add_event(spare.name, "surgery", "--auto-cordon: the judge cannot put %s in "
                            "(%s); `rankdeck cordon` from a console can" % (spare.name, exc))


WARM = "RANKDECK_WARM_SPARES"  # 0 in the run's env: spares start cold at a cordon


async def warm_spares(ctl, spec, endpoint: str, slurm: bool) -> None:
    """Each spare's torchrun started now and held before the rendezvous (agent/surgery/spare_hold.py):
    a cordon then puts it in without its start and torch's import (docs/SURGERY.md, "Warm
    spares"). torchrun launches only (the others' commands name their node's place), with a
    judge (it ends a held spare with the run), not in a Slurm job (its turns are the whole
    run's). A spare that cannot be held says why and stays cold: the run goes on."""
    names = [h.name for h in ctl.inventory.spares if h.name in ctl.connected()]
    if not names or spec.launcher or spec.launch_with != "torchrun" or slurm or \
            not ctl.judge_ref or spec.env.get(WARM) == "0":
        return
    order = ctl.run_hosts()
    result = await ctl.gather_nodes(lambda link: link.request(
        "start", run_root=link.run_root, node=link.name, record=ctl.record,
        spec=dict(ctl.node_spec(link.host, spec, endpoint, order[:-1] + [link.host]),
                  hold=True)), names)
    for name, res in result.items():
        if isinstance(res, BaseException):
            ctl.state.add_event(name, "surgery", "%s stays a cold spare (%s): a cordon starts "
                                "its torchrun then" % (name, res))
        else:
            ctl.state.nodes[name].warm = True
            ctl.state.add_event(name, "surgery", "%s is a warm spare: its torchrun is loaded "
                                "and held before the rendezvous" % name)


async def spares_running(ctl) -> list[str]:
    """The spares whose agent says they run: held warm (:func:`warm_spares`), or put in by the
    judge (``--auto-cordon``) while no console recorded it. A run's stop stops them too."""
    spares = [n for n, role in ctl.roles().items() if role == SPARE and n in ctl.connected()]
    states = await ctl.gather_nodes(lambda link: link.request(
        "state", run_root=link.run_root, node=link.name), spares)
    return [n for n, st in states.items() if isinstance(st, dict) and st.get("alive")]
