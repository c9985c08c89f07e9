"""The run's judge (agent/judge/judge.py, console/judgement/judged.py) from the RunController's side
(console/run/run.py passes itself as ``ctl``): started at launch beside the rendezvous store,
and asked who is stuck (``why``), or this console takes the verdict when there is none.
"""

from __future__ import annotations

import secrets as _secrets

from inventory.addresses import listen_address
from inventory.model import Host
from ..slurm import slurm
from ..errors import AgentError
from ..transport.base import HostUnreachable
from ..lines.sanitize import clean_tree, mask_tree
from ..launch.spec import LaunchSpec
from ..surgery.surgery import nnodes_range
from ..judgement.why import take_verdict
from .link import NodeLink


async def start_judge(ctl, rdzv: Host, hosts: list[Host], spec: LaunchSpec) -> None:
    """Start the run's judge beside the store; a host whose agent has none (an older one)
    leaves this console judging, which it says."""
    token = _secrets.token_hex(32)
    # the nodes started now; a spare joins the judge's view when put in (console/surgery/cordon.py)
    settings = {"addr": rdzv.addr, "token": token, "nodes": [h.name for h in hosts],
                "stall_after": spec.stall_after, "on_hang": spec.on_hang,
                "on_nan": spec.on_nan,
                "on_loop": spec.on_loop, "loop_restarts": spec.loop_restarts,
                "max_wall": spec.max_wall, "notify": spec.notify,
                "notify_on": spec.notify_on, "max_restarts": spec.max_restarts,
                "launcher": spec.launch_with,  # DeepSpeed's --on-hang restart: every node
                "secrets": list(ctl.secrets),
                # node surgery by the judge (agent/judge/cordon.py, docs/SURGERY.md)
                "cordon_within_s": spec.cordon_within, "auto_cordon": spec.auto_cordon,
                # hosts flagged by their record (console/verbs/hosts.py flags_at_launch)
                "flagged": list(spec.flagged or []),
                "spares": [h.name for h in ctl.inventory.spares],
                "nnodes_min": nnodes_range(spec.nnodes, len(hosts))[0],
                # a job `submit` made ends with the run (docs/SLURM.md)
                "release_job": slurm.job_of(ctl.inventory.transport or "")
                if spec.release_job else None,
                # --prometheus (agent/judge/prometheus.py): where, and each node's address
                "prometheus": prometheus_spec(spec.prometheus, rdzv, ctl.inventory.hosts)}
    try:
        info = await ctl.links[rdzv.name].request(
            "judge_start", run_root=ctl.root_of(rdzv.name), spec=settings, timeout=60)
    except AgentError as exc:
        why = "its agent has none (older than this console)" if exc.kind == "usage" \
            else str(exc)
        ctl.state.add_event(rdzv.name, "judge", "no judge on the hosts (%s): this console "
                            "judges the run, only while it is attached" % why)
        return
    ctl.record["judge"] = {"host": rdzv.name, "addr": rdzv.addr, "port": info.get("port")}
    served = info.get("prometheus") if isinstance(info.get("prometheus"), dict) else {}
    if spec.prometheus and isinstance(served.get("url"), str):
        ctl.record["judge"]["prometheus"] = served["url"]
    elif spec.prometheus:  # the run goes on; the judge's own event says so too
        ctl.state.add_event(rdzv.name, "judge", "no Prometheus metrics: %s" % (
            served.get("error") or "the judge on %s serves none (an older agent)" % rdzv.name))
    ctl.judge_ref = {"addr": rdzv.addr, "port": info.get("port"), "token": token}


def prometheus_spec(given: str | None, rdzv: Host, hosts: list[Host]) -> dict | None:
    """``--prometheus [ADDR:]PORT`` as the judge's spec takes it: ADDR (default: the
    rendezvous host's, where the judge listens), PORT and every host's address by name (the
    ``host`` label; spares too, which may join)."""
    if not given:
        return None
    addr, port = listen_address(given)
    return {"addr": addr or rdzv.addr, "port": port, "hosts": {h.name: h.addr for h in hosts}}


async def why(ctl) -> dict:
    """Who is stuck now: the verdict, also kept in ``state.verdict``. The run's judge takes
    it when there is one (every console then shows the same); else this console does."""
    link = ctl.links.get(ctl.judge_host() or "")
    if link is not None and link.stream is not None:
        try:
            verdict = await link.request("judge", run_root=link.run_root, ask="why",
                                         timeout=90)
        except AgentError as exc:
            ctl.state.add_event(link.name, "judge", "the judge did not answer (%s): this "
                                "console takes the verdict" % exc)
        else:
            verdict = mask_tree(clean_tree(verdict), ctl.state.masker)
            ctl.state.set_verdict(verdict)
            return verdict
    return await take_verdict(ctl)


async def judges_goodput(ctl) -> dict | None:
    """serve's ``goodput`` answer from the judge's host: the report the run's judge last wrote
    (agent/judge/goodput.py; console/records/goodput.py ``from_judge`` checks it). That host
    alone is connected when no link to it is up, and left as it was found; None when there is
    no judge, its host is out of reach or its agent is older (no such request)."""
    name = ctl.judge_host()
    if not name or name not in {h.name for h in ctl.inventory.hosts}:
        return None
    link, own = ctl.links.get(name), False
    if link is None or link.stream is None:
        if link is not None:
            return None
        link = NodeLink(ctl.inventory.host(name), ctl.transport, ctl.state, ctl.root_of(name),
                        reconnect=False, me=ctl.me)
        own = True
        try:
            await link.connect()
        except (HostUnreachable, AgentError, OSError):
            await link.close()
            return None
    try:
        return await link.request("goodput", run_root=link.run_root, timeout=30)
    except AgentError:
        return None
    finally:
        if own:
            await link.close()
