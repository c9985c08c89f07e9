"""A Slurm job as rankdeck's hosts: its nodes, their addresses, the rendezvous node's check.

``rankdeck launch --slurm JOB`` runs on nodes the job holds, not on an inventory's host list:
the inventory names only the login host (how to reach it, the nodes' python, workdir, env).
:func:`job_inventory` asks the login host (``scontrol show job -o``, ``scontrol show
hostnames``, ``scontrol show node -o``, ``getent ahostsv4``) and builds the run's Inventory:
one Host per node, named as Slurm names it, its address the one the other nodes reach it at,
its ``ssh`` the login host (console/transport/slurm.py goes through it). A rendezvous on
localhost or 127.0.1.1 (a node whose name resolves to loopback) would leave every node alone
in its own rendezvous: refused with what to fix.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import time
from dataclasses import dataclass, replace

# squeue's words, read alike by the supervisors on the nodes (agent/wire/slurm.py)
from agent.wire.slurm import ALIVE as JOB_ALIVE, JUDGE_COMMENT, QUEUED as JOB_QUEUED
from agent.wire.slurm import seconds_left as time_left_s
from inventory.model import Host, Inventory
from ..errors import EXIT_UNREACHABLE, LaunchError, UsageError
# what the login host says (squeue's reason, sinfo's, a command's stderr) is untrusted text
from ..lines.sanitize import one_line as said

JOB_ID = re.compile(r"\d+(?:_\d+)?")  # 123, or an array task 123_4
FIELD = re.compile(r"(\w[\w/:]*)=(\S*)")
TRANSPORT_PREFIX = "slurm:"


@dataclass
class SlurmJob:
    """What ``scontrol show job -o`` says of a job (the fields rankdeck reads)."""

    job_id: str
    state: str
    reason: str
    node_list: str
    fields: dict


def job_from_env(given: str) -> str:
    """The job id of ``--slurm JOB``, or of ``--slurm`` alone (``SLURM_JOB_ID``); UsageError
    when there is none or it is not a job id."""
    job = given if given != "env" else os.environ.get("SLURM_JOB_ID", "")
    if not job:
        raise UsageError("--slurm without a job id reads SLURM_JOB_ID, which is not set: run "
                         "it inside the allocation's shell (salloc, sbatch), or give the job: "
                         "--slurm JOBID")
    if not JOB_ID.fullmatch(job):
        raise UsageError("--slurm %r is not a Slurm job id (e.g. 1234, or 1234_5 for an "
                         "array task)" % job[:40])
    return job


def parse_fields(line: str) -> dict:
    """``Key=Value`` pairs of one ``scontrol -o`` record (values without spaces)."""
    return {k: v for k, v in FIELD.findall(line)}


def parse_job(job_id: str, text: str) -> SlurmJob:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise UsageError("scontrol knows no job %s" % job_id)
    fields = parse_fields(lines[0])
    return SlurmJob(job_id=fields.get("JobId", job_id), state=fields.get("JobState", "?"),
                    reason=fields.get("Reason", ""), node_list=fields.get("NodeList", ""),
                    fields=fields)


def node_addrs(text: str) -> dict:
    """``{NodeName: NodeAddr}`` from ``scontrol show node -o``."""
    out = {}
    for line in text.splitlines():
        fields = parse_fields(line)
        if "NodeName" in fields:
            out[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return out


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost" or addr.startswith("localhost.")


def rendezvous_refusal(node: str, name: str, resolved: str) -> str | None:
    """Why the first node cannot be the rendezvous at ``resolved``, or None."""
    if is_loopback(resolved) or is_loopback(name):
        return ("the rendezvous would be on %s's address %s (NodeAddr %s), a loopback "
                "address: every node would wait alone in its own rendezvous. Give the node a "
                "NodeAddr the other nodes reach (slurm.conf), or fix the login host's and "
                "nodes' /etc/hosts so that %s resolves to its network address, not "
                "127.0.1.1" % (node, resolved, name, name))
    return None


async def _login(transport, login: Host, argv: list, what: str) -> str:
    status, out, err = await transport.on_login(login, argv)
    if status != 0:
        detail = (err or out).strip().splitlines()[-1:] or ["exit %s" % status]
        raise LaunchError("on the login host %s, %s failed: %s"
                          % (login.ssh or login.name, what, said(detail[0])), EXIT_UNREACHABLE)
    return out


async def read_job(transport, login: Host, job: str) -> SlurmJob:
    status, out, err = await transport.on_login(login, ["scontrol", "show", "job", "-o", job])
    if status != 0:
        text = (err or out).strip()
        if "Invalid job id" in text:
            raise UsageError("Slurm has no job %s (scontrol: Invalid job id specified); "
                             "`squeue --me` lists yours" % job)
        raise LaunchError("on the login host %s, `scontrol show job %s` failed: %s"
                          % (login.ssh or login.name, job, said(text) or "exit %s" % status),
                          EXIT_UNREACHABLE)
    return parse_job(job, out)


def login_host(inv: Inventory) -> Host:
    """The one host of a Slurm inventory, the login host; UsageError otherwise."""
    if len(inv.hosts) != 1 or inv.transport != "ssh":
        raise UsageError("%s: on Slurm the inventory names one host, the login host where "
                         "srun and scontrol run (its ssh:, and the nodes' python, workdir and "
                         "env); it has %d host%s%s" % (
                             inv.path, len(inv.hosts), "" if len(inv.hosts) == 1 else "s",
                             "" if inv.transport == "ssh" else " and transport: %s"
                             % inv.transport))
    return inv.hosts[0]


async def job_inventory(inv: Inventory, job_id: str, transport) -> Inventory:
    """The run's Inventory on job ``job_id``'s nodes (see the module docstring). ``inv`` names
    the login host (its one host); UsageError/LaunchError say what to fix."""
    login = login_host(inv)
    job = await read_job(transport, login, job_id)
    if job.state != "RUNNING":
        raise UsageError("Slurm job %s is %s%s: launch --slurm runs inside a running "
                         "allocation; wait until squeue shows it RUNNING"
                         % (job_id, job.state, " (%s)" % job.reason
                            if job.reason not in ("", "None") else ""))
    names = (await _login(transport, login, ["scontrol", "show", "hostnames", job.node_list],
                          "`scontrol show hostnames %s`" % job.node_list)).split()
    if not names:
        raise LaunchError("Slurm job %s has no nodes (NodeList=%r)" % (job_id, job.node_list),
                          EXIT_UNREACHABLE)
    addrs = node_addrs(await _login(transport, login, ["scontrol", "show", "node", "-o",
                                                       ",".join(names)],
                                    "`scontrol show node`"))
    first = addrs.get(names[0], names[0])
    resolved = (await _login(transport, login, ["getent", "ahostsv4", first],
                             "resolving %s (getent ahostsv4)" % first)).split()
    refusal = rendezvous_refusal(names[0], first, resolved[0] if resolved else first)
    if refusal:
        raise UsageError(refusal)
    hosts = [replace(login, name=n, addr=resolved[0] if n == names[0] and resolved
                     else addrs.get(n, n), env=dict(login.env)) for n in names]
    return Inventory(path=inv.path, hosts=hosts, transport=TRANSPORT_PREFIX + job.job_id,
                     name=inv.name, sync=inv.sync, notify=inv.notify,
                     prometheus=inv.prometheus)


CGROUP_WARNING = (
    "this Slurm tracks a step's processes by cgroup (ProctrackType=proctrack/cgroup): the "
    "run's supervisors, store and judge live in a rankdeck-host step of their own on each "
    "node, which ends once they have; --requeue is not supported here; docs/SLURM.md, "
    "\"proctrack/cgroup sites\"")


def clear_text_warning(secrets) -> str | None:
    """What to warn at ``launch --slurm`` and ``submit`` when the run sends secret values
    (``secrets``), or None: SSH ends at the login host, and from there srun carries the
    agents' traffic to the nodes, encrypted only where the site set Slurm up with TLS
    (docs/SECURITY.md, "On Slurm")."""
    count = len({s for s in secrets or () if s})
    if not count:
        return None
    return ("on Slurm, the run's %d secret value%s (and the judge's token, and the files "
            "--sync sends) cross the cluster network in clear unless the site set Slurm up "
            "with TLS: SSH ends at the login host, and srun carries them from there to each "
            "node. Where the site lets you SSH to the job's nodes, an inventory of the nodes "
            "keeps them inside SSH; docs/SECURITY.md, \"On Slurm\""
            % (count, "" if count == 1 else "s"))


def requeue_refusal(args) -> str | None:
    """Why ``args`` (launch --slurm, submit) cannot run on a proctrack/cgroup site, or None:
    ``--requeue`` ends the job's steps, the rankdeck-host step that holds the run among them,
    and nothing starts it again when the job runs again (not built: docs/SLURM.md), so
    nothing is started."""
    if not getattr(args, "requeue", False):
        return None
    return ("--requeue: this Slurm tracks a step's processes by cgroup (ProctrackType="
            "proctrack/cgroup): a requeue ends the steps that hold the run, and rankdeck does "
            "not start them again when the job runs again yet. Nothing was started. Run it "
            "without --requeue (--signal-before alone has the run checkpoint before the "
            "limit); docs/SLURM.md, \"proctrack/cgroup sites\"")


async def site_warning(transport, login: Host) -> str | None:
    """What the site's Slurm settings change for a run (proctrack/cgroup: the transport asks
    ``scontrol show config``, console/transport/slurm.py), or None; None too when scontrol
    could not say."""
    return CGROUP_WARNING if await transport.cgroup_site(login) else None


def job_of(transport_kind: str) -> str | None:
    """The job id of a Slurm run's recorded transport (``slurm:1234``), else None."""
    if transport_kind.startswith(TRANSPORT_PREFIX):
        return transport_kind[len(TRANSPORT_PREFIX):]
    return None


# -- a Slurm run's job now: state, reason, time left (status) -----------------------------
JOB_ENDS = {"CANCELLED": "cancelled", "TIMEOUT": "timeout", "NODE_FAIL": "failed",
            "PREEMPTED": "cancelled", "FAILED": "failed", "OUT_OF_MEMORY": "failed"}


async def job_now(transport, login: Host, job: str) -> dict:
    """``{"job", "state", "reason", "time_left_s", "judged"}`` from ``squeue`` on the login
    host (``judged``: the run's judge ended it, its comment says); state ``GONE`` once Slurm
    no longer knows the job, ``UNKNOWN`` when squeue could not answer."""
    try:
        code, out, err = await transport.on_login(login, ["squeue", "-h", "--states=all",
                                                          "-j", job, "-o", "%T|%r|%L|%k"])
    except Exception as exc:  # noqa: BLE001 (the login host unreachable: say so, go on)
        return {"job": job, "state": "UNKNOWN", "reason": said(str(exc), 200),
                "time_left_s": None}
    fields = (out.strip().splitlines() or [""])[0].split("|", 3)  # (a comment may hold |)
    if code != 0 or not fields[0]:
        gone = "Invalid job id" in err or (code == 0 and not fields[0])
        return {"job": job, "state": "GONE" if gone else "UNKNOWN",
                "reason": "" if gone else (said(err, 200) or "exit %s" % code),
                "time_left_s": None}
    return {"job": job, "state": said(fields[0], 64),
            "reason": said(fields[1]) if len(fields) > 1 and fields[1] != "None" else "",
            "time_left_s": time_left_s(fields[2]) if len(fields) > 2 else None,
            "judged": len(fields) > 3 and fields[3].startswith(JUDGE_COMMENT)}


def with_job(status: dict, job: dict, requeue: bool = False, submitted: bool = False) -> dict:
    """``status`` with ``slurm`` (the job now) added; a run its job outlived is ended by it:
    ``cancelled`` (scancel, preemption), ``timeout`` or ``failed``, ``slurm.ended`` saying
    why in words; ``slurm.checkpoint_age_s`` beside the time left. A ``requeue`` run's job back in the queue is waited for
    (``slurm.requeued``). A job ``submit`` made (``submitted``) the run's judge ends once the
    run is over: ``COMPLETED`` when it succeeded, ``FAILED`` when not (agent/judge/judge.py), its
    comment saying so (``judged``); one that ended ``FAILED`` without it Slurm ended before
    (a start it could not make: the job's batch script never ran)."""
    status["slurm"] = dict(job)
    # beside the time left, how old the run's last complete checkpoint is (None: none yet)
    last = next((c for c in status.get("checkpoints") or () if c.get("last_complete")), None)
    status["slurm"]["checkpoint_age_s"] = round(time.time() - last["ts"]) \
        if last and last.get("ts") else None
    state = job["state"]
    if state in JOB_ALIVE or state == "UNKNOWN":
        return status
    if state in JOB_QUEUED and requeue:
        status["slurm"]["requeued"] = True  # the run waits for it (agent/slurm/job.py)
        return status
    words = {"CANCELLED": "was cancelled (scancel, by you or an administrator)",
             "TIMEOUT": "reached its time limit", "GONE": "is over (Slurm no longer knows it)",
             "COMPLETING": "is ending"}.get(state, "ended %s" % state)
    if submitted and (state == "COMPLETED" or state == "FAILED" and job.get("judged")):
        words = "ended %s: the run's judge ended it once the run was over" % state
    elif submitted and state == "FAILED":
        words = "ended FAILED before the run was over: Slurm ended it, not the run's judge " \
            "(`scontrol show job %s` or the controller's log says why)" % job["job"]
    status["slurm"]["ended"] = "Slurm job %s %s%s" % (
        job["job"], words, " (%s)" % job["reason"] if job["reason"] else "")
    if state != "COMPLETING" and status.get("state") not in ("succeeded", "failed", "stopped"):
        ends = dict(JOB_ENDS, COMPLETED="succeeded") if submitted else JOB_ENDS
        status["state"] = ends.get(state, "stopped")  # (ending: its end state comes next)
    return status


NODE_WELL = ("allocated", "mixed", "idle", "completing", "reserved", "planned")


def node_words(text: str, names: list[str]) -> dict:
    """``{node: "draining (disk full)"}`` from ``sinfo -h -N -o '%N|%T|%E'``: each of
    ``names`` Slurm does not have up and well, in Slurm's words (a ``*`` after the state:
    not responding)."""
    out = {}
    for line in text.splitlines():
        node, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        state, reason = said(state, 64), said(reason)
        if node in names and state and state not in NODE_WELL:
            words = state[:-1] + ", not responding" if state.endswith("*") else state
            out[node] = words + (" (%s)" % reason if reason and reason != "none" else "")
    return out


async def nodes_now(transport, login: Host, names: list[str]) -> dict:
    """The run's nodes Slurm has drained, down or failing (:func:`node_words`); {} when none,
    or when sinfo could not answer."""
    try:
        code, out, _err = await transport.on_login(login, ["sinfo", "-h", "-N", "-n",
                                                           ",".join(names), "-o", "%N|%T|%E"])
    except Exception:  # noqa: BLE001 (the login host unreachable: job_now said so)
        return {}
    return node_words(out, names) if code == 0 else {}


async def job_and_nodes(transport, hosts: list[Host], job: str) -> tuple[dict, dict]:
    """The job now (:func:`job_now`) and the run's nodes Slurm has not up and well
    (:func:`nodes_now`), both asked on the login host, the first of ``hosts``."""
    login = hosts[0]
    return (await job_now(transport, login, job),
            await nodes_now(transport, login, [h.name for h in hosts]))


def with_nodes(status: dict, words: dict) -> dict:
    """``status`` with each node Slurm has drained, down or failing said so in Slurm's words
    (``slurm.nodes`` and the node's own ``slurm``)."""
    if words:
        status.setdefault("slurm", {})["nodes"] = dict(words)
        for node in status.get("nodes") or ():
            if node.get("name") in words:
                node["slurm"] = words[node["name"]]
    return status


async def steps_left(transport, login: Host, job: str, wait_s: float = 20.0) -> list[str] | None:
    """rankdeck's steps still in ``job`` (``squeue -h -s -j JOB``: names ``rankdeck-*``),
    waited for up to ``wait_s``: the console's ``serve`` steps end just after its streams
    close. None when squeue could not answer."""
    deadline = time.monotonic() + wait_s
    while True:
        code, out, _err = await transport.on_login(login, ["squeue", "-h", "-s", "-j", job,
                                                           "-o", "%i %j"])
        if code != 0:
            return None
        left = [said(row.split()[0], 64) for row in out.splitlines()
                if len(row.split()) > 1 and row.split()[1].startswith("rankdeck-")]
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.5)
