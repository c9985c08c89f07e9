"""LaunchSpec: what a run starts, and the command line it becomes on each host.

Plain data and string building, no I/O: the run id, each node's run folder under its workdir
(as the user wrote the workdir; the agent expands it on the host), torchrun's argv.
"""

from __future__ import annotations

import os
import secrets as _secrets
import sys
import time
from dataclasses import dataclass, field

from inventory.model import Host

RDZV_CONF = "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3"


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
    # a folder the agent watches for new saves, for trainers that print nothing when they save
    # (as written: relative to the host's workdir, ~ read on the host)
    checkpoint_dir: str | None = None
    # what the run's judge on the hosts applies (agent/judge.py, docs/JUDGE.md): the run's own
    # settings, so every console, attached now or later, judges it alike
    stall_after: float = 60.0  # a rank stalls after max(this, 5 x its median step time)
    on_hang: str = "warn"  # warn | restart (the node the verdict names) | stop (the run)
    on_nan: str = "warn"  # warn | stop (the run, at a rank's first inf or NaN loss)
    max_wall: float | None = None  # seconds: the judge stops the run after this long
    notify: str | None = None  # a shell command run on the judge's host, an event on stdin
    notify_on: list[str] | None = None  # the kinds of events notified (None: all)


def new_run_id() -> str:
    """Time, then 48 random bits: the id is the run's marker on every host (``RANKDECK_RUN``,
    what `stop` kills by), so two launches in the same second must never share one."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + _secrets.token_hex(6)


def run_root(host: Host, run_id: str) -> str:
    return os.path.join(host.workdir, ".rankdeck", "runs", run_id)


def torchrun_argv(host: Host, spec: LaunchSpec, run_id: str, nnodes: str, endpoint: str,
                  log_dir: str) -> list[str]:
    python = host.python or sys.executable
    if spec.launcher:
        return list(spec.launcher) + [spec.script] + list(spec.args)
    argv = [
        python, "-m", "torch.distributed.run",
        "--nnodes", nnodes,
        "--nproc-per-node", str(spec.nproc_per_node or host.slots),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        # an elastic run proceeds 5 s after its last node arrived (docs/FACTS.md, "Hangs,
        # kills and restarts")
        "--rdzv-conf", RDZV_CONF + (",last_call_timeout=5" if ":" in nnodes else ""),
        "--local-addr", host.addr,
        "--max-restarts", str(spec.max_restarts),
        "--monitor-interval", "1",
        "--log-dir", log_dir,
        "--redirects", "3",
    ]
    if spec.module:
        argv.append("-m")
    return argv + [spec.script] + list(spec.args)
