"""One command-line template per launcher, filled in for each node of a run.

A run is started on every node by that node's agent, with the same template and the node's
own place in the run (:class:`NodePlace`): its node rank, the node count, the master address
and port (the rendezvous store rankdeck starts on the first host), the run id as the
rendezvous id, and the processes on this node and in all. What each launcher does underneath,
and how rankdeck knows the rank of every line (docs/LAUNCHERS.md):

- ``torchrun``: ``python -m torch.distributed.run``, c10d rendezvous on rankdeck's store,
  each rank's output in ``--log-dir`` files (``--redirects 3``), its rank from torchrun's own
  worker-group record (agent/torchrun/log.py).
- ``accelerate``: ``python -m accelerate.commands.launch --multi_gpu``; it runs torch's
  elastic launcher in its own process (``torch.distributed.run.run``), so the same files and
  records. ``--redirects``, ``--rdzv-id`` and ``--local-addr`` are not ``accelerate launch``
  options: torch's parser reads them from ``PET_REDIRECTS``, ``PET_RDZV_ID``,
  ``PET_LOCAL_ADDR`` (torch/distributed/argparse_util.py ``env``), set in the node's env.
- ``deepspeed``: ``python -m deepspeed.launcher.runner --no_ssh --node_rank K --hostfile H``
  (the ``deepspeed`` command's own module), which starts ``deepspeed.launcher.launch`` on
  this node only; that spawns the ranks itself (no elastic agent, no restarts of its own)
  and ``--enable_each_rank_log D`` writes each rank's stdout and stderr to
  ``D/<time>_rank<R>.log``: the rank is in the file's name. The hostfile is written by the
  agent into the node's run folder (the node spec's ``hostfile``); the ranks reach the
  process group's store through rankdeck's store (``TORCHELASTIC_USE_AGENT_STORE``: torch
  connects to it instead of binding the port on rank 0).

:func:`check_commands` refuses a launch whose per-node commands would not differ where they
must, naming the field.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from inventory.model import LAUNCHERS, Host

RDZV_CONF = "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3"
TORCHRUN_MODULE = "torch.distributed.run"
MONITOR_S = "0.25"  # torchrun's look at its workers (--monitor-interval)
ACCELERATE_MODULE = "accelerate.commands.launch"
DEEPSPEED_MODULE = "deepspeed.launcher.runner"
HOSTFILE = "hostfile"  # in the node's run folder, written by the agent (deepspeed)


class TemplateError(ValueError):
    """A launch whose per-node commands would be wrong; the text names the field and the
    fix. Usually means a hand-written launcher argv or an option that cannot vary per node."""


@dataclass(frozen=True)
class NodePlace:
    """One node's place in a run: what every launcher's template is filled with."""

    host: Host
    node_rank: int
    nnodes: str  # "N", or "MIN:MAX" for an elastic run (torchrun only)
    master_addr: str
    master_port: str  # digits; in a dry run, before the store has one, a placeholder
    run_id: str
    nproc: int  # processes on this node
    total: int  # processes in the run
    log_dir: str  # where the ranks' output goes (the node's run folder's torchrun/)
    node_dir: str  # the node's run folder, as the user wrote the workdir


@dataclass
class NodeCommand:
    """What the agent starts on one node: the argv, env added for the launcher, and the
    DeepSpeed hostfile's text (None for the others)."""

    argv: list[str]
    env: dict[str, str]
    hostfile: str | None = None


def places(hosts: list[Host], nproc_per_node: int | None, nnodes: str | None, endpoint: str,
           run_id: str, node_dir_of) -> list[NodePlace]:
    """Each host's :class:`NodePlace`, in node-rank order (the order of ``hosts``)."""
    addr, _, port = endpoint.rpartition(":")
    nprocs = [nproc_per_node or h.slots for h in hosts]
    return [NodePlace(host=h, node_rank=k, nnodes=nnodes or str(len(hosts)), master_addr=addr,
                      master_port=port, run_id=run_id,
                      nproc=nprocs[k], total=sum(nprocs),
                      log_dir=os.path.join(node_dir_of(h), "torchrun"),
                      node_dir=node_dir_of(h))
            for k, h in enumerate(hosts)]


def command(launcher: str, place: NodePlace, script: str, args: list[str], module: bool,
            max_restarts: int, hosts_nproc: list[tuple[str, int]] | None = None) -> NodeCommand:
    """``launcher``'s command for the node at ``place``. ``hosts_nproc``: every node's
    (name, processes) in node-rank order, for DeepSpeed's hostfile."""
    if launcher not in LAUNCHERS:
        raise TemplateError("launcher %r: choose one of %s" % (launcher, ", ".join(LAUNCHERS)))
    python = place.host.python or sys.executable
    tail = (["-m"] if module else []) + [script] + list(args)
    if launcher == "torchrun":
        return NodeCommand(_torchrun(python, place, max_restarts) + tail, {})
    if launcher == "accelerate":
        return _accelerate(python, place, max_restarts, module, script, args)
    return _deepspeed(python, place, module, script, args, hosts_nproc or [])


def _torchrun(python: str, p: NodePlace, max_restarts: int) -> list[str]:
    return [
        python, "-m", TORCHRUN_MODULE,
        "--nnodes", p.nnodes,
        "--nproc-per-node", str(p.nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "%s:%s" % (p.master_addr, p.master_port),
        "--rdzv-id", p.run_id,
        # an elastic run proceeds 5 s after its last node arrived (docs/FACTS.md, "Hangs,
        # kills and restarts")
        "--rdzv-conf", RDZV_CONF + (",last_call_timeout=5" if ":" in p.nnodes else ""),
        "--local-addr", p.host.addr,
        "--max-restarts", str(max_restarts),
        # how soon torchrun sees its workers failed (a node restarted or cordoned) and rejoins:
        # every 0.25 s, the rendezvous poll's pace (agent/torchrun/rdzv_poll.py: each look also asks
        # for nodes waiting, from a copy of the state kept that long); 1 s cost every restart
        # and cordon 0.4 s on average (docs/BENCHMARKS.md, "Node surgery")
        "--monitor-interval", MONITOR_S,
        "--log-dir", p.log_dir,
        "--redirects", "3",
    ]


def _accelerate(python: str, p: NodePlace, max_restarts: int, module: bool, script: str,
                args: list[str]) -> NodeCommand:
    # --multi_gpu picks accelerate's torch.distributed.run path on CPU as well (without it a
    # host with no GPU gets the one-process simple launcher); --num_processes is the total
    # (accelerate divides it by --num_machines). The rendezvous is rankdeck's c10d store, as
    # for torchrun: a restarted node rejoins it.
    argv = [python, "-m", ACCELERATE_MODULE,
            "--multi_gpu", "--num_machines", p.nnodes, "--machine_rank", str(p.node_rank),
            "--main_process_ip", p.master_addr, "--main_process_port", p.master_port,
            "--num_processes", str(p.total),
            "--rdzv_backend", "c10d",
            "--rdzv_conf", RDZV_CONF,
            "--max_restarts", str(max_restarts), "--monitor_interval", MONITOR_S,
            "--log_dir", p.log_dir, "--tee", "0",
            "--mixed_precision", "no", "--dynamo_backend", "no",
            "--num_cpu_threads_per_process", "1"]
    env = {"PET_REDIRECTS": "3", "PET_RDZV_ID": p.run_id, "PET_LOCAL_ADDR": p.host.addr}
    return NodeCommand(argv + (["-m"] if module else []) + [script] + list(args), env)


def _deepspeed(python: str, p: NodePlace, module: bool, script: str, args: list[str],
               hosts_nproc: list[tuple[str, int]]) -> NodeCommand:
    argv = [python, "-m", DEEPSPEED_MODULE,
            "--no_ssh", "--node_rank", str(p.node_rank),
            "--hostfile", os.path.join(p.node_dir, HOSTFILE),
            "--master_addr", p.master_addr, "--master_port", p.master_port,
            "--enable_each_rank_log", p.log_dir]
    if module:
        argv.append("--module")
    hostfile = "".join("%s slots=%d\n" % (name, n) for name, n in hosts_nproc)
    # rank 0 would bind MASTER_PORT itself; rankdeck's store listens there already. One
    # thread per rank unless the user says otherwise (--env), as torchrun does: DeepSpeed's
    # launcher leaves every rank all the cores, and on CPU they fight over them
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1"}
    return NodeCommand(argv + [script] + list(args), env, hostfile)


# -- the template check -------------------------------------------------------------------
# per launcher: the options whose value must differ from node to node, and those that must
# be the same on every node (the run's totals), with what each one is
_DIFFER = {
    "torchrun": {"--local-addr": "the node's own address"},
    "accelerate": {"--machine_rank": "the node rank"},
    "deepspeed": {"--node_rank": "the node rank"},
}
_SAME = {
    "torchrun": {"--nnodes": "the node count", "--rdzv-endpoint": "the rendezvous address",
                 "--rdzv-id": "the rendezvous id"},
    "accelerate": {"--num_machines": "the node count",
                   "--num_processes": "the total process count (accelerate divides it by "
                                      "--num_machines)",
                   "--main_process_ip": "the master address",
                   "--main_process_port": "the master port"},
    "deepspeed": {"--master_addr": "the master address", "--master_port": "the master port"},
}


def option(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in ``argv`` (``--x v`` or ``--x=v``), or None."""
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word[len(name) + 1:]
    return None


def check_commands(launcher: str, commands: dict[str, NodeCommand]) -> None:
    """TemplateError unless the per-node commands differ where they must and agree where
    they must: a node rank on every node and no two alike, the run's totals (node count,
    total processes, master address) the same everywhere."""
    if len(commands) < 2 or launcher not in _DIFFER:
        return
    for field, what in _DIFFER[launcher].items():
        seen: dict[str, str] = {}
        for node, cmd in commands.items():
            value = option(cmd.argv, field)
            if value is None:
                raise TemplateError("%s: %s's command has no %s (%s); every node needs its own "
                                    "%s" % (launcher, node, field, what, field))
            if value in seen:
                raise TemplateError("%s: %s and %s have the same %s %s (%s); give each node "
                                    "its own" % (launcher, seen[value], node, field, value, what))
            seen[value] = node
    for field, what in _SAME[launcher].items():
        values = {node: option(cmd.argv, field) for node, cmd in commands.items()}
        if len(set(values.values())) > 1:
            shown = ", ".join("%s %s" % (n, v) for n, v in values.items())
            raise TemplateError("%s: %s must be %s, the same on every node, but it differs (%s); "
                                "give the run's value, not the node's" % (launcher, field, what,
                                                                           shown))
    if launcher == "accelerate":
        _check_accelerate_total(commands)


def _check_accelerate_total(commands: dict[str, NodeCommand]) -> None:
    node, cmd = next(iter(commands.items()))
    machines, total = option(cmd.argv, "--num_machines"), option(cmd.argv, "--num_processes")
    if machines and total and machines.isdigit() and total.isdigit() and \
            int(total) < int(machines):
        raise TemplateError("accelerate: --num_processes %s is fewer than --num_machines %s "
                            "(%s); --num_processes is the total over every node, not one "
                            "node's" % (total, machines, node))


def check_launcher_spec(launcher: str, nnodes: str | None, hosts_nproc: list[int]) -> None:
    """TemplateError for a run this launcher cannot express: an elastic ``--nnodes MIN:MAX``
    (only torchrun's rendezvous admits a changing node count), under accelerate one process
    in all or nodes with different process counts (it takes one total and divides it
    evenly). (DeepSpeed's ``--on-hang restart`` restarts every node: docs/LAUNCHERS.md.)"""
    if launcher == "torchrun":
        return
    if nnodes and ":" in nnodes:
        raise TemplateError("--nnodes %s: an elastic node count is torchrun's; %s starts a "
                            "fixed number of nodes: give --nnodes N or use --launcher torchrun"
                            % (nnodes, launcher))
    if launcher == "accelerate" and sum(hosts_nproc) < 2:
        raise TemplateError("accelerate: %d process in all; its multi-machine launch "
                            "(--multi_gpu) refuses fewer than 2: use --launcher torchrun for "
                            "one process, or more nodes or slots" % sum(hosts_nproc))
    if launcher == "accelerate" and len(set(hosts_nproc)) > 1:
        raise TemplateError("accelerate: the hosts have different process counts (slots %s); "
                            "accelerate launch divides --num_processes evenly over the nodes: "
                            "give --nproc-per-node or equal slots" % hosts_nproc)
