"""`rankdeck launch --no-tui` prints who is stuck when the ranks stall: real torchrun and gloo
on 2 local nodes, rank 1 hung in Python by the reference trainer; the verdict lines name
rank 1, its node, its line and the source line the host read."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading

import pytest

from tests.cli import UNBUFFERED, rankdeck, start_rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import TINY, TRAINER, processes_of
from .test_stuck import line_of

pytestmark = pytest.mark.e2e
TIMEOUT = 300


def read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


def lines_until(lines: queue.Queue, seen: list[str], done, timeout: float) -> None:
    """Takes what rankdeck printed into ``seen`` until ``done(seen)``; fails if it ended."""
    def printed() -> bool:
        while not done(seen):
            try:
                line = lines.get_nowait()
            except queue.Empty:
                return False
            assert line is not None, "rankdeck ended first:\n" + "\n".join(seen[-40:])
            seen.append(line)
        return True
    wait_for_sync(printed, timeout, lambda: "the line awaited; rankdeck printed:\n"
                  + "\n".join(seen[-40:]))


def test_no_tui_prints_the_verdict_naming_the_hung_rank_and_its_line(tmp_path):
    inv = write_inventory(tmp_path, tmp_path / "work", 2)
    proc = start_rankdeck(
        "launch", "--no-tui", "--skip-preflight", "-i", inv, "--max-restarts", "0",
        "--stall-after", "6", "--grace", "3", TRAINER,
        "--", *TINY, "--steps", "100000", "--ckpt-every", "0", "--pg-timeout", "600",
        "--hang-at-step", "6", "--hang-rank", "1",
        env=UNBUFFERED, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=read_lines, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    run_id = None
    try:
        lines_until(lines, seen, lambda s: any(" started on 2 nodes" in x for x in s), TIMEOUT)
        run_id = next(x for x in seen if " started on 2 nodes" in x).split()[2]
        lines_until(lines, seen, lambda s: any("> time.sleep(3600)" in x for x in s), TIMEOUT)
    finally:
        proc.send_signal(signal.SIGINT)  # detach; the run is stopped below
        proc.wait(60)
        if run_id:
            rankdeck("stop", run_id, env=UNBUFFERED)
    verdict = [x for x in seen if x.startswith("[rankdeck] stuck-in-python:")]
    assert len(verdict) == 1, seen[-40:]
    i = seen.index(verdict[0])
    line = line_of("time.sleep(3600)")
    assert "never entered by rank 1 on node" in verdict[0], verdict
    node = verdict[0].split("never entered by rank 1 on ")[1].split()[0]
    assert seen[i + 1].startswith("[rankdeck]   suspect rank 1 on %s at " % node), seen[i + 1]
    assert seen[i + 1].endswith("trainer/faults.py:%d in injected_hang" % line), seen[i + 1]
    assert seen[i + 2] == "[rankdeck]     > time.sleep(3600)", seen[i + 2]
    # the node named is where rank 1 ran: its own line says so
    assert any(x.startswith("[%s r1] " % node) for x in seen), "rank 1 printed on another node"
    left = processes_of(run_id)
    for pid, _cmd in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], left
