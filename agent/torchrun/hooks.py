"""The node's hook folder: what rankdeck puts into torchrun's and its workers' Python.

``<node>/frhook/`` holds ``sitecustomize.py`` (agent/torchrun/frhook.py: the live flight-recorder
dumps, in the workers), ``rankdeck_rdzv_poll.py`` (agent/torchrun/rdzv_poll.py: the quicker
rendezvous poll, in torchrun) and ``rankdeck_spare_gate.py`` (agent/torchrun/spare_gate.py: a warm
spare's torchrun held before its rendezvous), and goes first on PYTHONPATH in torchrun's
environment, which its workers inherit. The first two have their switch in the run's env
(``RANKDECK_FLIGHT_RECORDER=0``, ``RANKDECK_RDZV_POLL=0``); the gate is armed only in a held
torchrun. With nothing to do the run's processes get no sitecustomize at all.
"""

import os
import shutil

from . import frhook, rdzv_poll, spare_gate

HOOK_DIR = "frhook"


def install(node_dir, env):
    """Put the hook on the path of torchrun and its workers in ``env`` (torchrun's
    environment); returns the folder the workers answer flight-recorder requests in, or None
    when the run switched the recorder off."""
    recorder, poll = frhook.enabled(env), rdzv_poll.seconds(env)
    held = spare_gate.gate_fd(env) is not None
    if not recorder and poll is None and not held:
        return None
    hook_dir = os.path.join(node_dir, HOOK_DIR)
    os.makedirs(hook_dir, mode=0o700, exist_ok=True)
    shutil.copyfile(os.path.abspath(frhook.__file__), os.path.join(hook_dir, "sitecustomize.py"))
    if poll is not None:
        shutil.copyfile(os.path.abspath(rdzv_poll.__file__),
                        os.path.join(hook_dir, rdzv_poll.MODULE + ".py"))
    if held:
        shutil.copyfile(os.path.abspath(spare_gate.__file__),
                        os.path.join(hook_dir, spare_gate.MODULE + ".py"))
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = hook_dir + (os.pathsep + old if old else "")
    if not recorder:
        return None
    fr_dir = os.path.join(node_dir, "fr")
    os.makedirs(fr_dir, mode=0o700, exist_ok=True)
    env.setdefault(frhook.BUFFER_VAR, frhook.BUFFER_ENTRIES)
    env[frhook.DIR_VAR] = fr_dir
    return fr_dir
