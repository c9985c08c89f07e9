"""The remote start of the agent (console/transport/agent_copy.py), run here without SSH: the
same one-line command a host's login shell gets, under ``sh`` with a private HOME.

The SSH tests (tests/e2e/test_ssh_transport.py, test_ssh_host_hardening.py) run it on hosts
that are not the laptop; these check what those cannot set up cheaply: the login's umask,
and which interpreter serve ends up in.
"""

import json
import os
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
            "from agent.gpu_nvml import import_pynvml\n"
            "print(import_pynvml().__name__)\n" % REPO)
    out = subprocess.run([sys.executable, "-E", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pynvml"
