"""The restart of a static world (DeepSpeed's launcher): every node starts again on a new port.

DeepSpeed's launcher starts one torch.distributed world from ``MASTER_ADDR:MASTER_PORT``
(env:// init, no rendezvous); its ranks reach the run's store there
(``TORCHELASTIC_USE_AGENT_STORE``), which adds no key prefix per start
(torch/distributed/rendezvous.py ``_create_c10d_store``). A node restarted alone has no world
to rejoin, and a world started again on the same store would meet the last one's keys. So
the whole world restarts (docs/LAUNCHERS.md): every node's launcher is killed, the rendezvous
host's store is started again (agent/store/tcpstore.py ``fresh_store``: a new process on a new
port, a fresh key space), and every node starts again with that port as its ``--master_port``.

Here: how the new port reaches a node's live supervisor (a file beside its state.json, read
at its next restart: a port is no secret, unlike the spec, which never goes to a file) and
how the supervisor puts it into its launcher's argv.
"""

import os

from ..host.runfiles import read_json, write_json_atomic

RESTART_WITH = "restart-with.json"
# launchers whose ranks form one static world, and the words that say so (events, outputs)
STATIC_WORLDS = {"deepspeed": "DeepSpeed's world is static"}
MASTER_PORT = "--master_port"


def master_port(value):
    """``value`` as a TCP port (1-65535); ValueError otherwise (a request's argument: untrusted)."""
    try:
        port = None if isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        port = None
    if port is None or not 0 < port < 65536:
        raise ValueError("master port %r is not a TCP port" % (value,))
    return port


def leave_master_port(ndir, port):
    """For the supervisor's next restart of the node in ``ndir``: start on ``port``."""
    write_json_atomic(os.path.join(ndir, RESTART_WITH), {"master_port": master_port(port)})


def take_master_port(ndir):
    """The port a restart request left for this restart (and no later one), or None."""
    path = os.path.join(ndir, RESTART_WITH)
    left = read_json(path, None)
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        return master_port(left.get("master_port")) if isinstance(left, dict) else None
    except ValueError:
        return None


def with_master_port(argv, port):
    """``argv`` with its ``--master_port`` value (``--master_port P`` or ``=P``) made ``port``;
    unchanged where it has none (not DeepSpeed's launcher)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word == MASTER_PORT and i + 1 < len(out):
            out[i + 1] = str(port)
            break
        if word.startswith(MASTER_PORT + "="):
            out[i] = "%s=%d" % (MASTER_PORT, port)
            break
    return out

