"""A worker that failed while its torchrun lives on (and restarts it), in torchrun's words.

torchrun says when a worker fails, at ERROR level, on its own console (torch/distributed/
elastic/multiprocessing/api.py, ``SubprocessContext._poll``)::

    E1123 13:46:04.111000 18546 .../api.py:1002] failed (exitcode: -6) local_rank: 0 (pid: 18594) of binary: /usr/bin/python

and then, with restarts left, restarts the worker group. The supervisor journals each as a
``worker_failed`` event naming the rank and the exit code, so that the console can tell a run
that is over from one that is not: a worker that aborted in its interpreter's teardown after
its last step gets restarted into a rendezvous no peer will join (agent/rules/judge.py ``ends_due``).
Standard library only; runs on Python >= 3.8.
"""

import re

_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")


def failures(text):
    """``(exit_code, local_rank, pid)`` of each worker failure torchrun reports in ``text``."""
    return [(int(code), int(local), int(pid)) for code, local, pid in _FAILED.findall(text)]
