"""A quicker look at the rendezvous while torchrun waits in it: every 0.25 s instead of 1 s.

torch's c10d rendezvous (``dynamic_rendezvous``, every torch from 2.4 to 2.15) reads the
shared state, and when it has to wait for other nodes sleeps one second before it looks again
(``_delay(seconds=1)`` in its op executor), and a look within a second of the last read is
answered from the copy it holds (``_BackendRendezvousStateHolder``'s ``cache_duration=1``).
So once the last node has joined, every other node learns that the round is complete up to a
second later, and the round's ranks are assigned when the slowest of them has looked: with
three nodes waiting, about 0.75 s on average, on every launch, restart and cordon
(docs/BENCHMARKS.md, "Node surgery").

The node's hook (agent/torchrun/frhook.py, Python's ``sitecustomize``) arms this in
torchrun's own process (not in its workers: they have ``LOCAL_RANK``): when torch imports
``dynamic_rendezvous``, its module-level ``_delay`` is wrapped so that a one-second wait is
``RANKDECK_RDZV_POLL`` seconds (default 0.25), and a state holder keeps its copy that long at
most; every other wait (the (0, 0.3) s skew of a first join) is torch's. A torch without both
is left alone. The cost is a read of the state from the store four times a second per waiting
node, during a rendezvous; between rendezvous torch reads it once per monitor interval and
per heartbeat, as before.

Set ``RANKDECK_RDZV_POLL=0`` in the run's env (inventory ``env:``) to keep torch's one second.
Standard library only, copied beside the hook as ``rankdeck_rdzv_poll.py``; torch is never
imported here.
"""

import os

VAR = "RANKDECK_RDZV_POLL"
DEFAULT = "0.25"
MODULE = "rankdeck_rdzv_poll"  # the copy's name in the hook folder
TARGET = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def seconds(env):
    """The poll ``env`` asks for, in seconds; None: torch's own (``0``, or not a number in
    (0, 1))."""
    try:
        value = float(env.get(VAR, DEFAULT))
    except ValueError:
        return None
    return value if 0 < value < 1 else None


def patch(module, poll):
    """Make ``module``'s one-second rendezvous wait, and the second its state is kept before
    it is read again, ``poll`` seconds; False when this torch lacks either (both are left
    alone) or they are changed already."""
    delay = getattr(module, "_delay", None)
    holder = getattr(module, "_BackendRendezvousStateHolder", None)
    if not callable(delay) or holder is None or getattr(delay, "rankdeck_poll", None):
        return False
    init = holder.__init__

    def _delay(seconds):
        return delay(poll if seconds == 1 else seconds)

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        kept = getattr(self, "_cache_duration", None)
        if isinstance(kept, (int, float)) and kept > poll:
            self._cache_duration = poll

    _delay.rankdeck_poll = poll
    module._delay = _delay
    holder.__init__ = __init__
    return True


def arm(after_import, env=None):
    """In torchrun's process (the hook calls this at start-up, with its ``after_import``:
    agent/torchrun/frhook.py): patch the rendezvous when torch imports it. Workers, and a run that said
    ``0``, are left alone."""
    env = os.environ if env is None else env
    poll = seconds(env)
    if poll is None or "LOCAL_RANK" in env:
        return
    after_import(TARGET, lambda module: patch(module, poll))
