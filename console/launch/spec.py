"""LaunchSpec: what a run starts, and the command line it becomes on each host.

Plain data and string building, no I/O: the run id, each node's run folder under its workdir
(as the user wrote the workdir; the agent expands it on the host), each node's command line
(from its launcher's template: console/launch/launchers.py).
"""

from __future__ import annotations

import os
import secrets as _secrets
import time
from dataclasses import dataclass, field

from inventory.model import Host

from .launchers import NodeCommand, check_commands, check_launcher_spec, command, places


@dataclass
class LaunchSpec:
    """What to run. ``nnodes`` is "N" or "MIN:MAX" (default: every host of the inventory)."""

    script: str
    args: list[str] = field(default_factory=list)
    nproc_per_node: int | None = None
    max_restarts: int = 3
    nnodes: str | None = None
    grace: float = 10.0
    metrics_regex: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    module: bool = False  # script is a module name (torchrun -m)
    sync: str | None = None  # a folder sent into every host's workdir before the start
    sync_include: list[str] = field(default_factory=list)  # secret-looking files to send too
    # An argv that replaces torchrun (benchmarks, non-torch launchers). It must write each
    # rank's output as torchrun's --log-dir layout under $RANKDECK_LOG_DIR.
    launcher: list[str] | None = None
    # the launcher each node is started with (console/launch/launchers.py): torchrun, deepspeed or
    # accelerate; ignored when ``launcher`` gives a raw argv
    launch_with: str = "torchrun"
    # a folder the agent watches for new saves, for trainers that print nothing when they save
    # (as written: relative to the host's workdir, ~ read on the host)
    checkpoint_dir: str | None = None
    # what the run's judge on the hosts applies (agent/judge/judge.py, docs/JUDGE.md): the run's own
    # settings, so every console, attached now or later, judges it alike
    stall_after: float = 60.0  # a rank stalls after max(this, 5 x its median step time)
    on_hang: str = "warn"  # warn | restart (the node the verdict names) | stop (the run)
    on_nan: str = "warn"  # warn | stop (the run, at a rank's first inf or NaN loss)
    # a restart loop (agent/judge/loops.py): stop | rollback | warn, after this many restarts
    on_loop: str = "stop"
    loop_restarts: int = 3
    max_wall: float | None = None  # seconds: the judge stops the run after this long
    notify: str | None = None  # a shell command run on the judge's host, an event on stdin
    notify_on: list[str] | None = None  # the kinds of events notified (None: all)
    # node surgery by the judge (docs/SURGERY.md): cordon a node proposed for it; a node in
    # trouble again this soon after its restart is proposed (0: never)
    auto_cordon: bool = False
    cordon_within: float = 600.0
    # hosts of the run flagged by their record (agent/rules/fleet.py): the judge proposes one
    # for cordon on its first trouble of this run
    flagged: list[str] | None = None
    # `[ADDR:]PORT`: the run's judge serves Prometheus metrics there (docs/PROMETHEUS.md);
    # ADDR defaults to the rendezvous host's address
    prometheus: str | None = None
    # on Slurm (docs/SLURM.md): ask for a checkpoint this many seconds before the job's time
    # limit; ``requeue``: then requeue the job and resume the run when it runs again
    signal_before: float | None = None
    requeue: bool = False
    # the run is in a job `submit` made: its judge ends the job once the run is over
    release_job: bool = False


# launchers whose ranks form one static world (no rendezvous a node could rejoin or leave):
# a restart restarts every node, on a fresh store (docs/LAUNCHERS.md), and says so
STATIC_WORLD_RESTART = {"deepspeed": "DeepSpeed's world is static: every node restarts"}
# ... and why `cordon` refuses them: {launcher: message with the run id}
STATIC_WORLD = {"deepspeed": (
    "cannot cordon a node of run %s: DeepSpeed's launcher starts one static world of the nodes "
    "its hostfile names, which no node can leave or join; nothing was changed. `rankdeck "
    "restart` restarts the whole world; for other nodes, stop the run and launch it again: "
    "the trainer resumes from its newest checkpoint")}


def launcher_name(spec: LaunchSpec) -> str:
    """What starts each node of ``spec``, as its causes, phases and events name it."""
    return "launcher" if spec.launcher else spec.launch_with


def new_run_id() -> str:
    """Time, then 48 random bits: the id is the run's marker on every host (``RANKDECK_RUN``,
    what `stop` kills by), so two launches in the same second must never share one."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + _secrets.token_hex(6)


def run_root(host: Host, run_id: str) -> str:
    return os.path.join(host.workdir, ".rankdeck", "runs", run_id)


def node_commands(hosts: list[Host], spec: LaunchSpec, run_id: str, endpoint: str,
                  root_of) -> dict[str, NodeCommand]:
    """Each host's command (console/launch/launchers.py), by host name, in node-rank order (the
    order of ``hosts``); ``root_of(host)``: the host's run folder. TemplateError when the
    launcher cannot express this run or the commands would not differ where they must."""
    nprocs = [spec.nproc_per_node or h.slots for h in hosts]
    if spec.launcher:  # a raw argv (benchmarks): no template, the script and its args
        return {h.name: NodeCommand(list(spec.launcher) + [spec.script] + list(spec.args), {})
                for h in hosts}
    check_launcher_spec(spec.launch_with, spec.nnodes, nprocs)
    at = places(hosts, spec.nproc_per_node, spec.nnodes, endpoint, run_id,
                lambda h: os.path.join(root_of(h), h.name))
    roster = [(h.name, n) for h, n in zip(hosts, nprocs)]
    commands = {p.host.name: command(spec.launch_with, p, spec.script, spec.args, spec.module,
                                     spec.max_restarts, roster) for p in at}
    check_commands(spec.launch_with, commands)
    return commands
