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
training; with ``proctrack/cgroup`` a site kills everything in a step's cgroup when the step
ends, which this transport cannot survive yet (docs/SLURM.md, "Not built yet").

``RANKDECK_SLURM_JOB`` in the step's environment tells the agent's supervisors which job
holds them: they stop the run when the job ends (scancel, the time limit), since Slurm's
``proctrack/linuxproc`` does not reap processes that left a step's tree.
"""

from __future__ import annotations

import shlex

from .ssh import SshTransport

JOB_ENV = "RANKDECK_SLURM_JOB"


def step_command(job: str, node: str, command: str, name: str = "rankdeck-agent") -> str:
    """``srun`` running the shell line ``command`` as one task on ``node`` of ``job``, beside
    the job's other steps (``--overlap``), its output unbuffered, srun's own notes quiet."""
    return " ".join([
        "srun", "--jobid=" + shlex.quote(job), "--overlap", "--nodes=1", "--ntasks=1",
        "--nodelist=" + shlex.quote(node), "--unbuffered", "--quiet",
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
