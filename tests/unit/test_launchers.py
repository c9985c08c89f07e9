"""console/launch/launchers.py and `launch --dry-run`: each launcher's per-node command lines, the
template check that refuses commands which would not differ (or agree) where they must, and
the dry run that prints them with secrets masked and starts nothing."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from console.launch.launchers import NodeCommand, TemplateError, check_commands, option
from console.launch.spec import LaunchSpec, node_commands
from inventory.loader import load_inventory
from inventory.model import InventoryError

from tests.cli import REPO, own_folders

SECRET = "hunter2-secret-value"
INVENTORY = """\
transport: local
launcher: {launcher}
hosts:
  - name: node0
    addr: 127.0.0.1
    slots: 2
    env:
      TOKEN: {{value: "{secret}", secret: true}}
  - name: node1
    addr: 127.0.0.2
    slots: 2
"""


def inventory(tmp_path, launcher="torchrun"):
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY.format(launcher=launcher, secret=SECRET))
    return path


def commands(tmp_path, launcher, **spec):
    inv = load_inventory(inventory(tmp_path)).resolve_local(str(tmp_path))
    spec = LaunchSpec(script="train.py", launch_with=launcher, **spec)
    return node_commands(inv.hosts, spec, "RUN", "127.0.0.1:29400", lambda h: "/w/runs/RUN")


@pytest.mark.parametrize("launcher,rank_flag", [("torchrun", None), ("deepspeed", "--node_rank"),
                                                ("accelerate", "--machine_rank")])
def test_each_node_gets_its_rank_and_the_runs_totals(tmp_path, launcher, rank_flag):
    cmds = commands(tmp_path, launcher)
    a, b = cmds["node0"].argv, cmds["node1"].argv
    if rank_flag:
        assert (option(a, rank_flag), option(b, rank_flag)) == ("0", "1")
    if launcher == "accelerate":  # the total, not one node's
        assert option(a, "--num_processes") == option(b, "--num_processes") == "4"
        assert cmds["node0"].env["PET_REDIRECTS"] == "3"
        assert cmds["node0"].env["PET_LOCAL_ADDR"] == "127.0.0.1"
    if launcher == "deepspeed":
        assert cmds["node0"].hostfile == "node0 slots=2\nnode1 slots=2\n"
        assert option(a, "--master_port") == "29400" and "--no_ssh" in a
        assert option(a, "--enable_each_rank_log") == "/w/runs/RUN/node0/torchrun"
    if launcher == "torchrun":
        assert option(a, "--local-addr") == "127.0.0.1" and option(b, "--local-addr") == "127.0.0.2"
    assert a[-1] == b[-1] == "train.py"


def test_the_check_names_a_missing_or_repeated_node_rank():
    ok = ["py", "-m", "deepspeed.launcher.runner", "--master_addr", "a", "--master_port", "1"]
    with pytest.raises(TemplateError, match="node1's command has no --node_rank"):
        check_commands("deepspeed", {"node0": NodeCommand(ok + ["--node_rank", "0"], {}),
                                     "node1": NodeCommand(ok, {})})
    with pytest.raises(TemplateError, match="node0 and node1 have the same --node_rank 0"):
        check_commands("deepspeed", {"node0": NodeCommand(ok + ["--node_rank", "0"], {}),
                                     "node1": NodeCommand(ok + ["--node_rank=0"], {})})


def test_the_check_refuses_a_per_node_process_count_for_accelerate():
    def acc(rank, total):
        return NodeCommand(["--num_machines", "2", "--machine_rank", rank, "--num_processes",
                            total, "--main_process_ip", "a", "--main_process_port", "1"], {})
    with pytest.raises(TemplateError, match="--num_processes must be the total process count"):
        check_commands("accelerate", {"node0": acc("0", "2"), "node1": acc("1", "4")})
    with pytest.raises(TemplateError, match="--num_processes 1 is fewer than --num_machines 2"):
        check_commands("accelerate", {"node0": acc("0", "1"), "node1": acc("1", "1")})


def test_an_elastic_node_count_is_torchruns_only(tmp_path):
    with pytest.raises(TemplateError, match="--nnodes 1:2: an elastic node count is torchrun's"):
        commands(tmp_path, "deepspeed", nnodes="1:2")


def test_accelerate_with_one_process_in_all_is_refused_before_it_starts(tmp_path):
    # accelerate itself says "You need to use at least 2 processes to use `--multi_gpu`"
    # (seen on a one-GPU host); rankdeck says it before anything starts
    inv = load_inventory(inventory(tmp_path)).resolve_local(str(tmp_path))
    spec = LaunchSpec(script="train.py", launch_with="accelerate", nproc_per_node=1)
    with pytest.raises(TemplateError, match="accelerate: 1 process in all"):
        node_commands(inv.hosts[:1], spec, "RUN", "127.0.0.1:29400", lambda h: "/w/runs/RUN")
    assert commands(tmp_path, "accelerate", nproc_per_node=1)  # two nodes of one: 2 in all


def test_on_hang_restart_is_taken_under_every_launcher(tmp_path):
    # DeepSpeed's static world: the judge restarts every node (agent/surgery/static_world.py)
    for launcher in ("deepspeed", "accelerate", "torchrun"):
        assert commands(tmp_path, launcher, on_hang="restart")


def test_inventory_launcher_is_checked_with_its_line(tmp_path):
    assert load_inventory(inventory(tmp_path, "accelerate")).launcher == "accelerate"
    with pytest.raises(InventoryError, match=r"inv.yaml:2: launcher must be one of .*"
                                             r"did you mean 'deepspeed'"):
        load_inventory(inventory(tmp_path, "deepspeedd"))


def dry_run(tmp_path, *flags, secret=SECRET, after=()):
    path = tmp_path / "inv.yaml"
    path.write_text(INVENTORY.format(launcher="torchrun", secret=secret))
    return subprocess.run(
        [sys.executable, "-m", "console", "launch", "-i", str(path), "--dry-run",
         "--env", "TOKEN=" + secret, *flags, "train.py", *after],
        cwd=tmp_path, env={"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin", **own_folders()},
        capture_output=True, text=True, timeout=120)


def test_dry_run_prints_every_nodes_command_marks_the_differences_and_masks(tmp_path):
    res = dry_run(tmp_path, "--launcher", "deepspeed")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert SECRET not in out and "TOKEN=****" in out
    assert "differs per node (^): --enable_each_rank_log, --hostfile, --node_rank" in out
    lines = out.splitlines()
    for node, rank in (("node0", "0"), ("node1", "1")):
        at = lines.index("%s (node rank %s):" % (node, rank))
        command, marks = lines[at + 1], lines[at + 2]
        where = command.index("--node_rank " + rank) + len("--node_rank ")
        assert marks[where] == "^"  # under the node rank
        assert marks[command.index("--no_ssh")] == " "
    assert not (tmp_path / ".rankdeck").exists()  # nothing was started


def test_dry_run_masks_a_secret_with_a_quote_and_spaces_before_quoting_it(tmp_path):
    """Quoted for the shell, ``it's`` is ``'it'"'"'s'``: masking the quoted line missed the
    secret (issue 40); each word is masked before it is quoted."""
    quoted = "it's my pass phrase-7f3a9c"
    res = dry_run(tmp_path, secret=quoted, after=("--", "--key", quoted, "--name", "x y"))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for piece in (quoted, shlex.quote(quoted), "pass phrase", "7f3a9c", "it'"):
        assert piece not in out, (piece, out)
    assert "TOKEN=****" in out and "--key **** --name 'x y'" in out, out


def test_dry_run_refuses_what_a_launch_would_refuse(tmp_path):
    res = dry_run(tmp_path, "--launcher", "accelerate", "--nnodes", "1:2")
    assert res.returncode == 2
    assert "elastic node count is torchrun's" in res.stderr and "Traceback" not in res.stderr
