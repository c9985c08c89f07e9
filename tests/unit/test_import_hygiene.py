"""The agent is standard library only (it runs on hosts where nothing is installed) and the
console's core (transport, state, controller) imports no Textual. Checked in subprocesses."""

import ast
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT_MODULES = sorted("agent." + n[:-3] for n in os.listdir(os.path.join(REPO, "agent"))
                       if n.endswith(".py") and n != "__main__.py")


def imported_after(modules, no_site=False):
    """Top-level module names loaded after importing ``modules`` (-S: no .pth hooks)."""
    code = ("import sys, json\n" + "".join("import %s\n" % m for m in modules) +
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable] + (["-S"] if no_site else []) + ["-c", code], capture_output=True, text=True,
                         cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), timeout=60)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


def test_agent_imports_only_the_standard_library():
    top = imported_after(AGENT_MODULES, no_site=True)
    foreign = sorted(top - set(sys.stdlib_module_names) - {"agent", "__main__"})
    assert foreign == [], "agent imports non-stdlib modules: %s" % foreign
    assert "console" not in top


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(os.path.join(REPO, "agent"))
                                        if n.endswith(".py")))
def test_agent_source_parses_as_python_3_8(name):
    with open(os.path.join(REPO, "agent", name)) as f:
        ast.parse(f.read(), filename=name, feature_version=(3, 8))


def test_console_core_imports_no_textual():
    core = ["console.model.state", "console.run.run", "console.run.link", "console.verbs.headless",
            "console.records.history", "console.lines.sanitize", "console.transport.base",
            "console.transport.local", "console.model.summary", "console.lines.text", "console.errors",
            "console.run.preflight"]
    if os.path.exists(os.path.join(REPO, "console", "transport", "ssh.py")):
        core.append("console.transport.ssh")
    top = imported_after(core)
    assert "textual" not in top and "rich" not in top


def test_cli_start_up_loads_neither_textual_nor_asyncssh():
    # both are imported lazily where needed (the TUI, the SSH transport): `rankdeck --help`,
    # `ls` and headless local runs do not pay for them
    top = imported_after(["console.verbs.cli"])
    assert "textual" not in top and "asyncssh" not in top


def test_the_agent_runs_on_python_3_9_and_later():
    """vermin reads every module and names any standard-library member, syntax or annotation
    newer than the agent's declared range's floor (docs/COMPAT.md: host Python 3.9-3.13);
    members used behind ``hasattr`` (os.pidfd_open) count too, so 3.8 is not claimed."""
    vermin = os.path.join(os.path.dirname(sys.executable), "vermin")
    out = subprocess.run([vermin, "-t=3.9-", "--violations", "--no-tips", "--eval-annotations",
                          "--no-parse-comments", os.path.join(REPO, "agent")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Minimum required versions: 3.9" in out.stdout or "3.8" in out.stdout, out.stdout
