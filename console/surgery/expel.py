"""A node's dead torchrun taken out of the run's c10d rendezvous, asked of the store's host
(agent/surgery/expel.py, the agent's ``expel``; docs/SURGERY.md "Taken out of the rendezvous"): after
a cordon's fence and after a node's restart, the survivors' next round does not wait
keep-alive x attempts (3 s with rankdeck's ``--rdzv-conf``) for the dead entry to expire.
The controller is passed in; this module imports no Textual."""

from __future__ import annotations

from ..errors import AgentError


async def expel(ctl, node: str, member) -> str:
    """Ask the store's host to take ``node``'s torchrun, dead now, out of the run's c10d
    rendezvous (``member``: who it was there, from the ``fence`` or ``restart`` answer);
    what came of it (``done``, ``not done: why``, ``not asked (why)``), also as the node's
    event. Nothing is asked without a ``member`` (an older agent, no c10d torchrun running):
    the entry expires as before."""
    link = ctl.links.get(ctl.record.get("rdzv_host") or "")
    if not isinstance(member, dict):
        return "not asked (no torchrun of a c10d rendezvous was named)"
    if link is None:
        return "not asked (the store's host is not connected)"
    try:
        # (node, detail: the line of the store host's action log, agent/host/actions.py)
        res = await link.request("expel", run_root=link.run_root, member=member, timeout=15,
                                 node=link.name, detail="to take %s's dead torchrun, pid %s, "
                                 "out of the rendezvous" % (node, member.get("pid")))
    except AgentError as exc:
        res = {"expelled": False, "why": str(exc)}
    if res.get("expelled") is True:
        said = "done"
        ctl.state.add_event(node, "rendezvous", "%s's torchrun taken out of the rendezvous at "
                            "once: the next round does not wait for its entry to expire" % node)
    else:
        said = "not done: %s" % str(res.get("why") or "no reason given")[:200]
        if res.get("gone") is True:  # expired first: the next round does not wait for it
            ctl.state.add_event(node, "rendezvous", "%s's torchrun was out of the rendezvous "
                                "already (%s)" % (node, said[10:]))
        else:
            ctl.state.add_event(node, "rendezvous", "%s's torchrun not taken out of the "
                                "rendezvous (%s): its entry expires by itself in seconds"
                                % (node, said[10:]))
    return said
