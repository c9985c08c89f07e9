"""The Slurm transport: agents on the nodes of a running job, through ``srun`` on the login host.

Every node of a Slurm run is reached the same way: one SSH connection to the login host (the
inventory's one host; shared by every node), and per agent stream one step of the job,
``srun --jobid J --overlap -N1 -n1 -w NODE``, whose task is the same shell line the SSH
transport runs on a host: check the agent cache in the node's own home, ask for the agent's
files if they are missing (they travel through srun's stdin), exec ``serve``. So the nodes
need no SSH, no agent installed and no shared disk; a site that lets its users run steps in
their own allocation is enough (docs/SLURM.md).

The step lives as long as the stream: closing it (EOF on srun's stdin) ends ``serve`` and so
the step. The node's supervisors were started by that ``serve`` but leave its process tree at
once (they are session leaders that outlive it), so a console that goes away leaves the run
training. A ``proctrack/cgroup`` site kills everything in a step's cgroup when the step ends,
so there :meth:`SlurmTransport.hold_nodes` first starts the job's ``rankdeck-host`` step on
the nodes (agent/slurm/host_step.py), a step of its own kept running on the login host, and the
run's supervisors, store and judge are its children (docs/SLURM.md, "proctrack/cgroup
sites").

``RANKDECK_SLURM_JOB`` in the step's environment tells the agent's supervisors which job
holds them: they stop the run when the job ends (scancel, the time limit), since Slurm's
``proctrack/linuxproc`` does not reap processes that left a step's tree.
"""

from __future__ import annotations

import asyncio
import shlex
import time

from agent.wire.slurm import proctrack_cgroup

from ..lines.sanitize import one_line
from .agent_copy import shell_word
from .ssh import SshTransport

JOB_ENV = "RANKDECK_SLURM_JOB"
HOST_STEP = "rankdeck-host"
HOST_UP_S = 90.0  # the rankdeck-host step answering on every node (srun's start, the agent's)
# the agent's cached copy run as ``host JOB`` (the cache was checked by the serve steps first)
HOST_BOOT = ("import sys,runpy; sys.path.insert(0, '.'); "
             "runpy.run_module('agent', run_name='__main__', alter_sys=True)")



def step_command(job: str, nodes: str, command: str, name: str = "rankdeck-agent") -> str:
    """``srun`` running the shell line ``command`` as one task on each of ``nodes`` (a name,
    or several joined by commas) of ``job``, beside the job's other steps (``--overlap``),
    its output unbuffered, srun's own notes quiet."""
    count = len(nodes.split(","))
    return " ".join([
        "srun", "--jobid=" + shlex.quote(job), "--overlap", "--nodes=%d" % count,
        "--ntasks=%d" % count, "--nodelist=" + shlex.quote(nodes), "--unbuffered", "--quiet",
        "--job-name=" + shlex.quote(name), "--export=ALL,%s=%s" % (JOB_ENV, shlex.quote(job)),
        "sh", "-c", shlex.quote(command),
    ])


class SlurmTransport(SshTransport):
    """Agent streams to the nodes of Slurm job ``job``, through ``srun`` on the login host.

    The nodes are inventory Hosts whose ``name`` is the Slurm node name and whose ``ssh`` is the
    login host; every other option is the SSH transport's (it reaches the login host).
    """

    def __init__(self, job: str, **ssh_options):
        super().__init__(**ssh_options)
        self.job = job
        self.cgroup = None  # the site's proctrack is cgroup (asked once: cgroup_site)

    async def _link(self, host):
        """One connection to the login host, shared by every node of the job."""
        spec = host.ssh or "localhost"
        return await self._shared(("login", spec), lambda: self._dial("login host", spec))

    def serve_command(self, host) -> str:
        return step_command(self.job, host.name, super().serve_command(host))

    async def run_command(self, host, command, timeout: float | None = None,
                          input: str | None = None) -> tuple[int, str, str]:
        """One command on the node ``host`` (a step of the job); see SshTransport."""
        if not isinstance(command, str):
            command = " ".join(shlex.quote(str(arg)) for arg in command)
        return await super().run_command(host, step_command(self.job, host.name, command,
                                                            "rankdeck-cmd"), timeout, input)

    async def on_login(self, login, argv, timeout: float = 60,
                       input: str | None = None) -> tuple[int, str, str]:
        """``argv`` on the login host itself (scontrol, squeue, sbatch, scancel)."""
        return await super().run_command(login, argv, timeout, input)

    async def cgroup_site(self, login) -> bool:
        """Whether this Slurm kills a step's cgroup when the step ends (asked once)."""
        if self.cgroup is None:
            try:
                code, out, _err = await self.on_login(login, ["scontrol", "show", "config"])
            except Exception:  # noqa: BLE001 (as if linuxproc: the launch says what fails)
                code, out = 1, ""
            self.cgroup = code == 0 and proctrack_cgroup(out)
        return self.cgroup

    def host_step_command(self, hosts) -> str:
        """The login host's shell line that starts the job's rankdeck-host step on ``hosts``
        and leaves it running there (a session of its own: the SSH connection may go)."""
        cache = "%s/agent-%s" % (self.remote_cache.rstrip("/"), self.bundle.version)
        inner = "cd %s && exec %s -E -S -c %s host %s" % (
            shell_word(cache), shell_word(hosts[0].python or "python3"),
            shlex.quote(HOST_BOOT), shlex.quote(self.job))
        srun = step_command(self.job, ",".join(h.name for h in hosts), inner, HOST_STEP)
        return "nohup setsid %s </dev/null >/dev/null 2>&1 &" % srun

    async def hold_nodes(self, hosts, ask_up) -> None:
        """On a proctrack/cgroup site, this job's rankdeck-host step answering on every one of
        ``hosts`` (started for those without one); ``ask_up(names)``: the names whose host
        answers (their ``serve`` asked, ``host_up``). RuntimeError saying which do not."""
        if not hosts or not await self.cgroup_site(hosts[0]):
            return
        missing = [h for h in hosts if h.name not in await ask_up([h.name for h in hosts])]
        if not missing:
            return
        code, _out, err = await self.on_login(hosts[0], ["sh", "-c",
                                                         self.host_step_command(missing)])
        if code != 0:
            raise RuntimeError("could not start the %s step: %s" % (HOST_STEP, one_line(err)))
        deadline = time.monotonic() + HOST_UP_S
        names = [h.name for h in missing]
        while True:
            names = [n for n in names if n not in await ask_up(names)]
            if not names:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the %s step does not answer on %s after %.0f s"
                                   % (HOST_STEP, ", ".join(names), HOST_UP_S))
            await asyncio.sleep(0.5)
