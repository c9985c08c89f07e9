"""e2e fixtures: real sshd hosts in network namespaces (root only), and a clean home.

``ssh_hosts`` is built once per session (four hosts, about 0.2 s) and torn down at the end;
tests that stop an sshd or cut a link put it back. Every e2e test runs with HOME in a temp
folder and no ssh-agent, so nothing reads or writes the real ~/.ssh; transports in tests are
given the fixture's ssh_config, known_hosts and client key explicitly.
"""

import subprocess

import pytest

try:
    from sshhosts import SshHosts, create_hosts, missing_requirements
except ImportError:  # tests/e2e made a package
    from .sshhosts import SshHosts, create_hosts, missing_requirements


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
