"""A warm spare: its torchrun started at launch, torch imported, held before the rendezvous.

A cordon puts a spare in (docs/SURGERY.md). Started cold, the spare's torchrun spends its
first 1.3-1.6 s on the supervisor's start and torch's import before it can join the round the
other nodes already wait in (docs/BENCHMARKS.md, "Node surgery"). A warm spare
pays that at launch instead: its supervisor starts torchrun with the read end of a pipe
(``RANKDECK_GATE_FD``), and rankdeck's hook in torchrun's own process (agent/torchrun/hooks.py, copied
beside agent/torchrun/frhook.py as ``rankdeck_spare_gate.py``) holds it in its first call for a
rendezvous handler, before it connects to the store or joins anything: torch is imported,
nothing of the run is touched. The supervisor writes one byte when the cordon puts the spare
in (agent/node/ops.py ``start``); torchrun then makes its handler and joins the round at once.

Held there, torchrun is in no rendezvous state: no heartbeat, no redundancy list (torch's own
spares would be taken by any restart of any node), no timeout. It costs a process with torch
imported (a few hundred MB of memory, no GPU memory: CUDA is not initialised) and no CPU: it
blocks reading the pipe. The pipe's end (its supervisor gone without a word) ends torchrun.

A torch whose launcher cannot be held here (no ``RendezvousHandlerRegistry.create_handler``)
ends torchrun at once with a word on stderr: the supervisor ends, and the cordon starts the
spare cold, as before. Workers (``LOCAL_RANK`` set) are never held. Standard library only;
torch is never imported here.
"""

import os
import sys

VAR = "RANKDECK_GATE_FD"
MODULE = "rankdeck_spare_gate"  # the copy's name in the hook folder
TARGET = "torch.distributed.elastic.rendezvous.api"
GO = b"g"
ABANDONED = 3  # torchrun's exit code when its supervisor went away while it was held


def gate_fd(env):
    """The gate's file descriptor named in ``env``, or None (not a held torchrun)."""
    try:
        fd = int(env.get(VAR, ""))
    except ValueError:
        return None
    return fd if fd >= 0 else None


def wait(fd):
    """Block until the supervisor writes the go byte; a closed pipe (the supervisor gone)
    ends this process: a held torchrun left alone must not stay."""
    try:
        got = os.read(fd, 1)
    except OSError:
        got = b""
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    if got != GO:
        sys.stderr.write("rankdeck: this warm spare's supervisor went away while it was held; "
                         "torchrun ends\n")
        sys.stderr.flush()
        os._exit(ABANDONED)


def patch(module, fd):
    """Hold ``module``'s (torch's rendezvous api) first handler made until the gate opens;
    False when this torch has no such call."""
    registry = getattr(module, "RendezvousHandlerRegistry", None)
    create = getattr(registry, "create_handler", None)
    if not callable(create):
        return False
    held = [fd]

    def create_handler(self, params):
        if held:
            wait(held.pop())
        return create(self, params)

    registry.create_handler = create_handler
    return True


def refuse():
    """This torch cannot be held: torchrun ends before it joins anything (a spare that joined
    unasked would take a place in the run's rendezvous)."""
    sys.stderr.write("rankdeck: this torch's launcher cannot be held before its rendezvous; "
                     "the warm spare ends (a cordon starts it cold)\n")
    sys.stderr.flush()
    os._exit(ABANDONED)


def arm(after_import, env=None):
    """In a held torchrun (the hook calls this at start-up, with its ``after_import``:
    agent/torchrun/frhook.py): hold its first rendezvous handler until the gate opens. The variable
    goes from the environment its workers inherit."""
    env = os.environ if env is None else env
    fd = gate_fd(env)
    if fd is None or "LOCAL_RANK" in env:
        return
    env.pop(VAR, None)
    after_import(TARGET, lambda module: patch(module, fd) or refuse(), refuse)
