"""Slurm fixtures: a real 4-node Slurm cluster on SSH test hosts (root only).

``slurm`` is built once per session (``slurm_cgroup``, the same with proctrack/cgroup, once
per module that asks): five namespace hosts from tests/e2e/sshhosts.py (node0..3
compute nodes, each with its own ``slurmd``; node4 the login host, where ``srun``/``squeue``
run as the user does on a real cluster) and the daemons of tests/slurm/slurmcluster.py. The
compute nodes have no agent and no project: what a run needs reaches them through rankdeck.
The e2e fixtures (a clean HOME, the user's ``project``, a per-test ``host_workdir``) are the
e2e folder's own, imported here.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

from sshhosts import create_hosts, missing_requirements  # noqa: E402
from tests.e2e.conftest import clean_home, host_workdir, project  # noqa: E402,F401
from tests.slurm.slurmcluster import create_cluster, missing_slurm  # noqa: E402

NODES = 4


@pytest.fixture(scope="session")
def slurm():
    """A SlurmCluster: compute nodes node0..node3, login host node4 (skips without root,
    sshd, ip or Slurm)."""
    yield from _cluster("linuxproc")


@pytest.fixture(scope="module")
def slurm_cgroup():
    """The same cluster with ``ProctrackType=proctrack/cgroup`` (a step owns its cgroup, as on
    most GPU sites); built for the module that asks, and gone after it."""
    yield from _cluster("cgroup")


def _cluster(proctrack: str):
    reason = missing_requirements() or missing_slurm()
    if reason:
        pytest.skip(reason)
    try:
        hosts = create_hosts(NODES + 1)
    except subprocess.CalledProcessError as exc:
        pytest.skip("cannot build network-namespace hosts here: %s: %s"
                    % (" ".join(exc.cmd), (exc.stderr or "").strip()))
    try:
        cluster = create_cluster(hosts, hosts.names[:NODES], proctrack=proctrack)
        try:
            yield cluster
        finally:
            cluster.close()
    finally:
        hosts.close()
