"""The test cluster itself is a real Slurm: jobs run as the user on the nodes' own hosts."""

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.root]


def test_a_step_runs_on_each_node_as_the_user_in_its_own_home(slurm):
    job = slurm.hold()
    try:
        out = slurm.as_user("srun --jobid %s --overlap -N%d --ntasks-per-node=1 sh -c "
                            "'echo $(hostname) $(id -un) $HOME "
                            "$(ls -A ~/.cache/rankdeck | wc -l)'"
                            % (job, len(slurm.nodes)))
        rows = sorted(line.split() for line in out.splitlines())
        assert rows == [[n, "rdkuser", "/home/rdkuser", "0"] for n in slurm.nodes]
    finally:
        slurm.cmd(["scancel", job])
