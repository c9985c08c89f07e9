"""Issue 29: host text never reaches the terminal raw. A run whose checkpoint and resume
paths, causes and torchrun phase hold OSC 52 clipboard writes, title changes, screen
clears and C1 controls, and stop/restart answers crafted the same way: what `status`, `stop`,
`restart` and the end of `--no-tui` print holds no ESC or C1 byte, and no forged line."""

from __future__ import annotations

import io
import re

from console.errors import AgentError
from console.verbs.headless import HeadlessPrinter
from console.model.state import RunState
from console.model.summary import control_lines, status_table

T0 = 1_700_000_000.0
# OSC 52 (write the clipboard), an OSC title, a screen clear, a C1 CSI, a newline that would
# forge a row of the table
HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;owned\x1b\\\x1b[2J\x9b31m\x9d0;t\x9c\nnode9: ok"
RAW = re.compile("[\x1b\x07\x80-\x9f]")


def hostile_run() -> RunState:
    state = RunState("r", [("node0", "10.0.0.1")])
    recs = [
        [{"k": "file", "f": 1, "rank": 0, "local_rank": 0, "attempt": 0, "instance": "i",
          "stream": "stdout", "world_size": 1, "path": "/x" + HOSTILE, "ts": T0}],
        [{"k": "metric", "f": 1, "step": 5, "loss": 1.5, "ts": T0 + 1}],
        [{"k": "ckpt", "f": 1, "step": 5, "path": "/ckpt/step5" + HOSTILE, "ts": T0 + 2}],
        [{"k": "resumed", "f": 1, "step": 3, "path": "/ckpt/step3" + HOSTILE, "ts": T0 + 3}],
        [{"k": "event", "what": "ended", "state": "failed", "exit_code": 1,
          "cause": {"message": "boom" + HOSTILE, "rank": 0}, "ts": T0 + 4}],
    ]
    state.apply_records("node0", recs, 100)
    state.apply_supervisor_state("node0", {"state": "failed", "phase": {
        "state": "rendezvous" + HOSTILE, "round": 2}})
    return state


def assert_clean(text: str, *present: str) -> None:
    assert not RAW.search(text), repr(RAW.search(text).group())
    assert "\nnode9: ok" not in text, "a host's newline forged a line"
    for part in present:
        assert part in text, (part, text)


def test_status_and_the_no_tui_end_print_no_escape():
    state = hostile_run()
    table = status_table(state.status())
    assert_clean(table, "/ckpt/step5", "/ckpt/step3", "boom")
    out = io.StringIO()  # the end of `--no-tui` (console/verbs/headless.py) prints the same table
    HeadlessPrinter(state, out=out, colour=False)
    print(status_table(state.status()), file=out)
    assert_clean(out.getvalue(), "boom")


def test_stop_and_restart_answers_print_no_escape():
    stop = {"node0": {"state": "stopped" + HOSTILE, "left": [], "kill": {
        "sigterm": [1, 2], "dstate": "pid 7" + HOSTILE, "gpu": {"held": 10, "pids": HOSTILE}}},
            "node1": AgentError("node1: refused" + HOSTILE, "error")}
    text = "\n".join(line.text for line in control_lines("stop", stop))
    assert_clean(text, "2 process(es) signalled", "pid 7", "refused")
    restart = {"node0": {"state": "running" + HOSTILE, "launches": "3" + HOSTILE,
                         "restarts": HOSTILE}}
    assert_clean("\n".join(line.text for line in control_lines("restart", restart)),
                 "node0: running")
