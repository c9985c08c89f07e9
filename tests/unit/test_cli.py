"""The CLI's answers to bad input: a clear message, the right exit code, nothing started."""

import os
import subprocess
import sys

import pytest

from console.verbs import cli, launch as launch_verbs
from console.launch import options as launch_options

from tests.cli import REPO, rankdeck, runs_folder, runs_recorded


def test_bad_inventory_is_exit_2_with_file_and_line(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("transport: local\nhosts:\n  - name: node0\n    adr: 127.0.0.2\n")
    out = rankdeck("launch", "-i", str(inv), "train.py")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "rankdeck: %s:4: unknown key 'adr' in host 'node0'; did you mean 'addr'? "
        "Allowed: addr, env, gpus, name, python, slots, spare, ssh, workdir" % inv)
    assert runs_recorded() == []


def test_missing_inventory_file(tmp_path):
    out = rankdeck("launch", "-i", str(tmp_path / "nope.yaml"), "train.py")
    assert out.returncode == 2 and "nope.yaml: no such file" in out.stderr


@pytest.mark.parametrize("args, message", [
    (["launch", "-i", "inventory/local.yaml", "--nnodes", "two", "t.py"],
     "--nnodes 'two': write N or MIN:MAX"),
    (["launch", "-i", "inventory/local.yaml", "--env", "1BAD=x", "t.py"],
     "--env '1BAD=x': write KEY=VALUE"),
    (["launch", "-i", "inventory/local.yaml", "--grace", "-5", "t.py"],
     "argument --grace: -5 must be at least 0"),
    (["launch", "-i", "inventory/local.yaml", "--max-restarts", "-1", "t.py"],
     "argument --max-restarts: -1 must be at least 0"),
    (["launch", "-i", "inventory/local.yaml", "--nproc-per-node", "1000000", "t.py"],
     "argument --nproc-per-node: 1000000 must be at least 1 and at most 1024"),
    (["launch", "-i", "inventory/local.yaml", "--stall-after", "inf", "t.py"],
     "argument --stall-after: inf is not a finite number"),
    (["status", "r", "--stall-after", "0"], "argument --stall-after: 0 must be above 0"),
    (["demo", "--steps", "x"], "argument --steps: 'x' is not a whole number"),
    (["launch", "-i", "inventory/local.yaml", "t.py", "--lr", "1", "--detach"],
     "rankdeck: --detach comes after the script t.py, so it would go to the script, not to "
     "rankdeck; put rankdeck's options before the script, or write `t.py -- --detach` if the "
     "script takes it"),
    (["launch", "-i", "inventory/local.yaml", "t.py", "--env=A=1"], "--env=A=1 comes after"),
    (["status", "no-such-run"], "run 'no-such-run' is unknown"),
    (["stop", "no-such-run"], "run 'no-such-run' is unknown"),
])
def test_usage_mistakes_are_exit_2(args, message):
    out = rankdeck(*args)
    assert out.returncode == 2, out
    assert message in out.stderr


@pytest.mark.parametrize("argv, handed", [
    (["launch", "-i", "x", "t.py", "--", "--detach"], ["--detach"]),
    (["launch", "-i", "x", "t.py", "--lr", "1", "--", "--detach"], ["--lr", "1", "--", "--detach"]),
    (["launch", "-i", "x", "--detach", "t.py", "--lr", "1"], ["--lr", "1"]),
])
def test_script_arguments_that_are_meant_for_the_script_pass(argv, handed):
    parser = cli.build_parser()
    args = parser.parse_args(argv)
    assert cli.own_option_after_script(parser, argv, args) is None
    assert launch_options.script_args(args.args) == handed


def test_no_command_prints_help_and_exits_2():
    out = rankdeck()
    assert out.returncode == 2 and "launch" in out.stdout


def test_unreachable_host_is_exit_3_and_nothing_starts(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("transport: local\ndefaults:\n  workdir: %s\nhosts:\n"
                   "  - {name: node0, addr: 127.0.0.2}\n"
                   "  - {name: node1, addr: 127.0.0.3, python: /nonexistent/python3}\n"
                   % tmp_path)
    out = rankdeck("launch", "--no-tui", "-i", str(inv), "train.py")
    assert out.returncode == 3, out
    assert "node1: no-python" in out.stderr and "nothing was started" in out.stderr
    assert not (tmp_path / ".rankdeck").exists()
    assert runs_recorded() == []


@pytest.mark.parametrize("verb", [["stop"], ["restart"], ["logs"], ["stacks"]])
def test_unknown_node_of_a_recorded_run_is_exit_2_before_connecting(tmp_path, verb):
    folder = runs_folder()
    os.makedirs(folder)
    with open(os.path.join(folder, "20260101-000000-abcd.json"), "w") as f:
        f.write('{"run_id": "20260101-000000-abcd", "created": 0, "transport": "local", '
                '"hosts": [{"name": "node0", "addr": "127.0.0.2", "python": "/nonexistent", '
                '"workdir": "%s"}], "spec": {"script": "t.py"}}' % tmp_path)
    out = rankdeck(*(verb + ["20260101", "--node", "node9"]))
    assert out.returncode == 2, out
    assert "run 20260101-000000-abcd has no node 'node9'; nodes: node0" in out.stderr
    assert "unreachable" not in out.stderr  # refused before any connection was tried


@pytest.mark.parametrize("nnodes, message", [
    ("6", "--nnodes 6 asks for more nodes than there are hosts: the inventory %s has 4 "
          "hosts and rankdeck starts one node on each; use --nnodes 4, or add hosts"),
    ("2", "--nnodes 2 asks for fewer nodes than there are hosts: the inventory %s has 4 "
          "hosts and rankdeck starts one node on each; use --nnodes 4, an elastic "
          "--nnodes 2:4, or an inventory of 2 hosts"),
    ("5:8", "--nnodes 5:8 needs at least 5 nodes, more than there are hosts"),
    ("1:2", "--nnodes 1:2 allows at most 2 nodes, fewer than there are hosts"),
    ("4:2", "--nnodes 4:2: MIN is above MAX; write MIN:MAX, e.g. --nnodes 2:4"),
    ("0", "--nnodes 0: a run needs at least 1 node"),
])
def test_nnodes_must_fit_the_inventory(nnodes, message):
    inv = os.path.join(REPO, "inventory", "local.yaml")  # 4 hosts
    out = rankdeck("launch", "--no-tui", "-i", inv, "--nnodes", nnodes, "t.py")
    assert out.returncode == 2, out
    assert (message % inv if "%s" in message else message) in out.stderr
    assert runs_recorded() == []


@pytest.mark.parametrize("nnodes", ["4", "1:4", "4:4", "2:8"])
def test_nnodes_that_fits_is_taken(nnodes, monkeypatch):
    """A --nnodes that fits the 4 hosts passes the check and is what the run is started
    with (the start itself is not made here)."""
    started = []

    async def start_run(inv, spec, args, inventory_path):
        started.append(spec)
        return 0
    monkeypatch.setattr(launch_verbs, "start_run", start_run)
    inv = os.path.join(REPO, "inventory", "local.yaml")  # 4 hosts
    assert cli.main(["launch", "--no-tui", "-i", inv, "--nnodes", nnodes, "t.py"]) == 0
    assert [spec.nnodes for spec in started] == [nnodes]


def test_sync_folder_that_is_not_there_is_exit_2(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("transport: local\ndefaults:\n  workdir: %s\nhosts:\n"
                   "  - {name: node0, addr: 127.0.0.2}\n" % tmp_path)
    out = rankdeck("launch", "--no-tui", "-i", str(inv), "--sync", str(tmp_path / "nope"),
                   "t.py")
    assert out.returncode == 2, out
    assert "--sync %s: not a folder on this machine" % (tmp_path / "nope") in out.stderr
    inv.write_text("transport: local\ndefaults:\n  workdir: %s\n  sync: code\nhosts:\n"
                   "  - {name: node0, addr: 127.0.0.2}\n" % tmp_path)
    out = rankdeck("launch", "--no-tui", "-i", str(inv), "t.py")
    assert out.returncode == 2, out
    # a relative defaults.sync is read against the inventory's folder, and named as such
    assert "defaults.sync in %s (%s): not a folder" % (inv, tmp_path / "code") in out.stderr
    assert not (tmp_path / ".rankdeck").exists() and runs_recorded() == []


@pytest.mark.parametrize("limits, expected", [((256, 20000), 16384), ((256, 512), 512)])
def test_the_console_raises_its_open_files_limit_for_many_hosts(limits, expected):
    """A socket per host: the console lifts a low soft limit (macOS: 256) towards 16,384,
    never above the hard limit (docs/SCALE.md)."""
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < limits[1]:
        pytest.skip("this machine's hard limit is %d" % hard)
    code = ("import resource\nfrom console.verbs.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limits),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) == expected, out.stdout


def test_cordon_of_a_node_that_cannot_be_reached_is_exit_3_and_changes_nothing(tmp_path):
    """A fence must confirm on the node's host that its processes are gone: an unreachable
    node is refused with the reason (docs/SURGERY.md), the record untouched."""
    import json
    folder = runs_folder()
    os.makedirs(folder)
    record = {"run_id": "20260101-000000-abcd", "created": 0, "transport": "local",
              "hosts": [{"name": "node0", "addr": "127.0.0.2", "workdir": str(tmp_path)},
                        {"name": "node1", "addr": "127.0.0.3", "workdir": str(tmp_path),
                         "python": "/nonexistent/python3"},
                        {"name": "node2", "addr": "127.0.0.4", "workdir": str(tmp_path)}],
              "spec": {"script": "t.py"}, "roles": {"node2": "spare"},
              "order": ["node0", "node1"], "nnodes": "2", "surgeries": []}
    path = os.path.join(folder, "20260101-000000-abcd.json")
    with open(path, "w") as f:
        json.dump(record, f)
    out = rankdeck("cordon", "20260101", "--node", "node1", "--yes")
    assert out.returncode == 3, out
    assert "cordon node1 of run" in out.stdout  # the preview first
    assert "cannot reach node1: a cordon must fence the node on its host" in out.stderr
    assert "nothing was done" in out.stderr
    with open(path) as f:
        assert json.load(f)["surgeries"] == []
    assert not os.path.exists(os.path.join(str(tmp_path), ".rankdeck", "runs",
                                           "20260101-000000-abcd", "node1", "fenced.json"))
