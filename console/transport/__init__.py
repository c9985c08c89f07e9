"""How bytes reach an agent. No Textual here (an import-hygiene test checks it).

:func:`make_transport` picks the transport an inventory names; the interface is base.py.
"""

from __future__ import annotations

import os

from .base import Transport
from .local import LocalTransport


def make_transport(kind: str, accept_new_host_keys: bool = False) -> Transport:
    """The transport for an inventory's ``transport:`` ("local" or "ssh"), or a Slurm run's
    ("slurm:JOB": srun through the login host, console/transport/slurm.py)."""
    if kind == "local":
        return LocalTransport()
    # Lazy for start-up time: asyncssh (and the cryptography it loads) takes a noticeable
    # part of a second to import, and the local transport and `--help` never need it.
    from .ssh import SshTransport
    from .slurm import SlurmTransport

    # RANKDECK_REMOTE_CACHE: where the agent is copied on the hosts (default
    # ~/.cache/rankdeck), for hosts whose home is read-only or shared.
    options = dict(accept_new_host_keys=accept_new_host_keys,
                   remote_cache=os.environ.get("RANKDECK_REMOTE_CACHE", "~/.cache/rankdeck"))
    if kind.startswith("slurm:"):
        return SlurmTransport(kind[len("slurm:"):], **options)
    return SshTransport(**options)
