"""Inventory paths read on the host (``~``, ``~/x``, relative to the login home) and the
preflight facts about them: workdir writable, python found, script or module present."""

import os
import stat
import sys

import pytest

from agent.host import paths as hostpaths
from agent.serve.preflight import host_facts, python_facts, script_facts, workdir_facts


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A login home of its own; the agent runs elsewhere (as `serve` runs in its cache)."""
    home = tmp_path / "home"
    (home / "proj").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


def test_paths_are_read_from_the_login_home(home):
    assert hostpaths.host_path("~") == str(home)
    assert hostpaths.host_path("~/proj") == str(home / "proj")
    assert hostpaths.host_path("proj/.rankdeck/runs/R") == str(home / "proj/.rankdeck/runs/R")
    assert hostpaths.host_path(".") == str(home)
    assert hostpaths.host_path("/srv/work/") == "/srv/work"


def test_python_is_a_path_or_a_command_name(home):
    assert hostpaths.host_python("python3") == "python3"  # looked up on PATH
    assert hostpaths.host_python("") == ""
    assert hostpaths.host_python("~/venv/bin/python") == str(home / "venv/bin/python")
    assert hostpaths.host_python("venv/bin/python") == str(home / "venv/bin/python")


def test_torchrun_argv_and_spec_made_absolute_on_the_host(home):
    spec = {
        "argv": ["~/venv/bin/python", "-m", "torch.distributed.run", "--nnodes", "4",
                 "--log-dir", "~/proj/.rankdeck/runs/R/node1/torchrun", "--redirects", "3",
                 "~/proj/train.py", "--data", "~/data", "--name", "a~b", "cfg.yaml"],
        "cwd": "proj",
        "env": {"HOME_LIKE": "~"},
    }
    out = hostpaths.host_spec(spec)
    assert out["argv"] == [
        str(home / "venv/bin/python"), "-m", "torch.distributed.run", "--nnodes", "4",
        "--log-dir", str(home / "proj/.rankdeck/runs/R/node1/torchrun"), "--redirects", "3",
        str(home / "proj/train.py"), "--data", str(home / "data"), "--name", "a~b", "cfg.yaml"]
    assert out["cwd"] == str(home / "proj")
    assert out["env"] == {"HOME_LIKE": "~"}  # environment values are the user's, untouched
    assert spec["cwd"] == "proj"  # the caller's spec is not changed
    assert hostpaths.host_argv(["python3", "--log-dir=logs"]) == [
        "python3", "--log-dir=%s" % (home / "logs")]


def test_preflight_reports_workdir_python_and_script(home, tmp_path):
    (home / "proj" / "train.py").write_text("print('hi')\n")
    venv_bin = home / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    os.symlink(sys.executable, str(venv_bin / "python"))
    facts = host_facts({"workdir": "~/proj", "python": "~/venv/bin/python",
                        "script": "train.py"})
    assert facts["workdir"] == str(home / "proj")
    assert facts["workdir_exists"] and facts["workdir_writable"]
    assert facts["python_exists"] and facts["python_path"] == str(venv_bin / "python")
    assert "python_error" not in facts  # the expanded path is what was probed
    assert facts["script"] == str(home / "proj" / "train.py") and facts["script_exists"]

    assert python_facts("venv/bin/nope") == {"python_path": None, "python_exists": False}
    assert python_facts("sh")["python_exists"]  # a command name is looked up on PATH
    assert script_facts("missing.py", False, str(home / "proj"), None)["script_exists"] is False
    assert script_facts("~/proj/train.py", False, "/elsewhere", None)["script_exists"]


def test_preflight_unwritable_or_missing_workdir(home):
    ro = home / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        facts = workdir_facts(hostpaths.host_path("~/ro"))
        assert facts["workdir_exists"]
        # root may write anywhere: then the answer is "writable", and that is the truth
        assert facts["workdir_writable"] == os.access(str(ro), os.W_OK)
    finally:
        ro.chmod(stat.S_IRWXU)
    facts = workdir_facts(hostpaths.host_path("~/nowhere"))
    assert facts["workdir_exists"] is False and facts["workdir_writable"] is False


def test_preflight_finds_a_module_with_the_host_python_from_the_workdir(home):
    pkg = home / "proj" / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("")
    (home / "proj" / "broken").mkdir()
    (home / "proj" / "broken" / "__init__.py").write_text("raise ImportError('no deps')\n")
    workdir = hostpaths.host_path("~/proj")
    ok = script_facts("mypkg.train", True, workdir, sys.executable)
    assert ok["script_module"] and ok["script_exists"] is True
    missing = script_facts("nopkg.train", True, workdir, sys.executable)
    assert missing["script_exists"] is False
    broken = script_facts("broken.train", True, workdir, sys.executable)
    assert broken["script_exists"] is False and "no deps" in broken["script_error"]
