"""What a host's torch does that a restart must work around, read from its sources.

torch 2.4's torchrun, stopped with SIGTERM, shuts its rendezvous handler down
(local_elastic_agent.py ``_shutdown``: ``if not is_restart and self._rdzv_handler:
self._rdzv_handler.shutdown()``), and a c10d handler's shutdown closes the rendezvous for the
whole job: the node restarted after it and every other node then end with
RendezvousClosedError (seen in bench/compat.py's matrix; 2.8 and later do not, docs/COMPAT.md).
Such a torchrun is stopped for a restart by SIGKILL instead, before its workers are stopped as
always (agent/supervisor/launcher.py).

The source is read, not imported: importing torch costs seconds of CPU, and which versions
between 2.4 and 2.8 close is not known here; the line itself is the test.
"""

import os
import subprocess

CLOSING = "if not is_restart and self._rdzv_handler:"
AGENT_FILE = ("distributed", "elastic", "agent", "server", "local_elastic_agent.py")
FIND_TORCH = ("import importlib.util as u; s = u.find_spec('torch'); "
              "print(s.submodule_search_locations[0] if s and s.submodule_search_locations "
              "else '')")


def torch_dir(python, env=None):
    """The folder of the torch package ``python`` imports with ``env`` (not importing it);
    None when there is none or ``python`` does not answer."""
    try:
        res = subprocess.run([python, "-c", FIND_TORCH], env=env, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    folder = res.stdout.strip()
    return folder if res.returncode == 0 and folder else None


def closes_rendezvous_on_stop(folder):
    """True when the torch in ``folder`` closes the job's rendezvous as its torchrun stops
    on SIGTERM; False when it does not, or its source cannot be read."""
    if not folder:
        return False
    try:
        with open(os.path.join(folder, *AGENT_FILE), encoding="utf-8", errors="replace") as f:
            return CLOSING in f.read()
    except OSError:
        return False
