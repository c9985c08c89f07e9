"""SIGTERM handling: stop at a step boundary, or leave anyway when none comes.

The handler only sets a flag; the training loop reads it after each step, the ranks agree to
stop, local rank 0 saves and every rank exits 143. A rank blocked in a collective (a hung or
dead peer) never reaches the boundary, and Python runs no signal handler while the main thread
is inside C++. For that case a watchdog thread learns of the signal through
``signal.set_wakeup_fd`` (written by the C-level handler even while the main thread is blocked)
and, if the process is still alive ``grace`` seconds later, dumps every thread's stack to stderr
and exits 143. Without it torchrun waits its own 30 s before SIGKILL.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class StopRequest:
    """``requested`` becomes True on SIGTERM; call ``install`` once, from the main thread."""

    def __init__(self, grace: float) -> None:
        self.requested = False
        self.grace = grace

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        if self.grace <= 0:
            return
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_fd,), name="sigterm-watchdog", daemon=True).start()

    def _on_signal(self, signum, frame) -> None:
        self.requested = True

    def _watch(self, read_fd: int) -> None:
        # The wakeup fd carries one byte per signal number that has a Python handler.
        while signal.SIGTERM not in os.read(read_fd, 64):
            pass
        time.sleep(self.grace)
        print(f"SIGTERM: no step boundary reached within {self.grace:g}s (blocked in a collective?); "
              f"exiting {EXIT_SIGTERM} without a checkpoint. Stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(EXIT_SIGTERM)
