"""e2e fixtures: real sshd hosts that are not the laptop (root only), and a clean home.

``ssh_hosts`` is built once per session (four hosts, a few seconds; the hosts' Python once per
machine, about 30 s) and torn down at the end; tests that stop an sshd or cut a link put it
back. Every e2e test runs with HOME in a temp folder and no ssh-agent, so nothing reads or
writes the real ~/.ssh; transports in tests are given the fixture's ssh_config, known_hosts
and client key explicitly.

The hosts share no disk with the laptop: code reaches them as a user's does, through
``--sync`` (``LaunchSpec.sync``) of ``project``, a laptop folder holding a copy of the
repository's trainer/ package, into ``host_workdir``, a ``~/proj-<test>-<random>`` workdir
that each host reads in its own home (unique per test, so tests share no state on the hosts).
The script is then ``trainer/train.py``, relative to that workdir.
"""

import os
import re
import secrets
import shutil
import subprocess

import pytest

try:
    from sshhosts import REPO, SshHosts, create_hosts, missing_requirements
except ImportError:  # tests/e2e made a package
    from .sshhosts import REPO, SshHosts, create_hosts, missing_requirements

TRAINER_DIR = os.path.join(REPO, "trainer")


@pytest.fixture(autouse=True)
def clean_home(tmp_path_factory, monkeypatch):
    """HOME in a temp folder and no SSH_AUTH_SOCK: the real ~/.ssh stays untouched."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture(scope="session")
def ssh_hosts() -> SshHosts:
    """Four sshd hosts node0..node3 on a private bridge (skips unless root with sshd and ip)."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    try:
        hosts = create_hosts(4)
    except subprocess.CalledProcessError as exc:  # e.g. root without CAP_NET_ADMIN
        pytest.skip("cannot build network-namespace hosts here: %s: %s"
                    % (" ".join(exc.cmd), (exc.stderr or "").strip()))
    yield hosts
    hosts.close()


@pytest.fixture
def host_workdir(request) -> str:
    """``~/proj-<test>-<random>``: a workdir as an inventory writes it (a tilde path, read on
    each host), not there until a launch's sync makes it; each host has its own."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)[:60]
    return "~/proj-%s-%s" % (label, secrets.token_hex(3))


@pytest.fixture
def project(tmp_path):
    """The user's project on the laptop (a pathlib.Path): a copy of the repository's trainer/
    package, which a launch sends to the hosts with ``--sync``."""
    proj = tmp_path / "project"
    shutil.copytree(TRAINER_DIR, str(proj / "trainer"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return proj
