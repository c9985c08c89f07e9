"""The remote start of the agent (console/transport/agent_copy.py), run here without SSH: the
same one-line command a host's login shell gets, under ``sh`` with a private HOME.

The SSH tests (tests/e2e/test_ssh_transport.py, test_ssh_host_hardening.py) run it on hosts
that are not the laptop; these check what those cannot set up cheaply: the login's umask,
and which interpreter serve ends up in.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from console.transport.agent_copy import SEND_MARKER, AgentBundle

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bundle():
    return AgentBundle.from_local()


def start(bundle, home, umask=0o022, python=sys.executable):
    """Start the agent as a host would and read its hello; (copied?, hello, stderr)."""
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.Popen(["sh", "-c", bundle.remote_command(python, "~/.cache/rankdeck")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, preexec_fn=lambda: os.umask(umask))
    line = proc.stdout.readline()
    copied = line.startswith(SEND_MARKER)
    if copied:
        proc.stdin.write(bundle.framed())
        proc.stdin.flush()
        line = proc.stdout.readline()
    try:
        with open("/proc/%d/cmdline" % proc.pid, "rb") as f:
            cmdline = f.read().split(b"\0")
    except OSError:
        cmdline = []
    proc.stdin.close()
    proc.wait(timeout=60)
    err = proc.stderr.read().decode(errors="replace")
    assert line.startswith(b"{"), (line, err)
    return copied, json.loads(line), cmdline, err


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_a_warm_start_does_not_copy_again_whatever_the_login_umask(bundle, tmp_path, umask):
    # With a group-writable umask (002: Debian and Ubuntu logins of users with their own
    # group), Python made agent/__pycache__ group-writable, the check refused the copy and
    # every connection copied the agent afresh.
    copied, hello, _cmd, err = start(bundle, tmp_path, umask)
    assert copied and hello["t"] == "hello" and hello["agent"] == bundle.version
    for _ in range(2):
        copied, hello, _cmd, err = start(bundle, tmp_path, umask)
        assert not copied, err
        assert "afresh" not in err
    cache = tmp_path / ".cache" / "rankdeck" / ("agent-" + bundle.version) / "agent"
    assert (cache / "__pycache__").stat().st_mode & 0o777 == 0o700
    assert list((cache / "__pycache__").iterdir()), "serve's modules were compiled once"


def test_serve_runs_in_the_bootstraps_interpreter(bundle, tmp_path):
    # one interpreter a connection: the bootstrap's (-E -S), not a second one exec'd
    start(bundle, tmp_path)
    _copied, hello, cmdline, _err = start(bundle, tmp_path)
    assert cmdline[:3] == [sys.executable.encode(), b"-E", b"-S"], cmdline
    assert hello["pid"] > 0


def test_pynvml_is_found_without_site(tmp_path):
    # serve's interpreter starts without site-packages; the GPU probe adds them when it
    # first wants pynvml (nvidia-ml-py is installed in this venv)
    code = ("import sys; sys.path.insert(0, %r)\n"
            "assert 'pynvml' not in sys.modules and sys.flags.no_site\n"
            "from agent.host.gpu_nvml import import_pynvml\n"
            "print(import_pynvml().__name__)\n" % REPO)
    out = subprocess.run([sys.executable, "-E", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pynvml"


def agent_with_a_package(tmp_path):
    """A copy of this agent with one sub-package added: agent/extra/{__init__,mod}.py."""
    folder = tmp_path / "src" / "agent"
    shutil.copytree(os.path.join(REPO, "agent"), folder,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "extra").mkdir()
    (folder / "extra" / "__init__.py").write_text("")
    (folder / "extra" / "mod.py").write_text("WHO = 'extra'\n")
    return folder


def test_an_agent_with_a_sub_package_is_copied_once_and_runs(tmp_path):
    bundle = AgentBundle.from_local(str(agent_with_a_package(tmp_path)))
    assert "extra/mod.py" in bundle.files and "extra/__init__.py" in bundle.files
    copied, hello, _cmd, err = start(bundle, tmp_path, umask=0o002)
    assert copied and hello["agent"] == bundle.version, err
    copied, hello, _cmd, err = start(bundle, tmp_path, umask=0o002)
    assert not copied and "afresh" not in err, err  # the bootstrap's hash is version.py's
    cache = tmp_path / ".cache" / "rankdeck" / ("agent-" + bundle.version) / "agent"
    assert (cache / "extra" / "mod.py").read_text() == "WHO = 'extra'\n"
    assert (cache / "extra").stat().st_mode & 0o777 == 0o700
    assert (cache / "extra" / "__pycache__").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("name", ["extra/deeper/mod.py", "../escaped.py", "extra/../../up.py",
                                  "/abs.py", ".hidden.py", "extra/.hidden.py", "__pycache__/x.py",
                                  "extra/", "ex tra/mod.py", "extra\\mod.py", "extra/mod.pyc"])
def test_a_crafted_payload_with_a_deeper_or_escaping_path_is_refused(tmp_path, name):
    files = dict(AgentBundle.from_local().files)
    files[name] = b"open(__import__('os').path.expanduser('~/pwned'), 'w').close()\n"
    crafted = AgentBundle("0123456789abcdef", files)
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run(["sh", "-c", crafted.remote_command(sys.executable, "~/.cache/rd")],
                          input=crafted.framed(), capture_output=True, env=env, timeout=60)
    assert proc.returncode != 0
    assert b"bad file name in agent payload" in proc.stderr, proc.stderr
    cache = tmp_path / ".cache" / "rd"
    assert not (cache / "agent-0123456789abcdef").exists()
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert not [p for p in written if "escaped" in p or "up.py" in p or "pwned" in p], written
    assert not os.path.exists("/abs.py")


@pytest.mark.parametrize("planted", ["agent/extra/deeper/mod.py", "agent/extra/.x.py",
                                     "agent/extra/__pycache__/deeper/x.pyc", "agent/ex-tra/a.py"])
def test_a_copy_with_a_deeper_entry_is_copied_afresh(tmp_path, planted):
    bundle = AgentBundle.from_local(str(agent_with_a_package(tmp_path)))
    start(bundle, tmp_path)
    home = tmp_path / ".cache" / "rankdeck" / ("agent-" + bundle.version)
    path = home / planted
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text("planted = True\n")
    copied, hello, _cmd, err = start(bundle, tmp_path)
    assert copied and "copying the agent afresh" in err and "unexpected" in err, err
    assert hello["agent"] == bundle.version
    assert not (home / planted).exists()
