"""Who is stuck on a torch with no flight recorder (2.4), with real parts: 4 local nodes,
torchrun, gloo, the reference trainer's hang, the hook answering "no flight recorder", py-spy.
The verdict names the hung rank from the stacks alone and says so in the summary, `why`'s
lines, the view's verdict screen and ``status``.

Runs only where the hosts' torch lacks the recorder: bench/compat.py runs it under torch 2.4
(``RANKDECK_TEST_HOST_PYTHON``, tests/spine/helpers.py); the suite's torch has one."""

from __future__ import annotations

import json
import subprocess

import pytest

from console.tui.verdict import verdict_text
from console.judgement.verdict import evidence_lines, verdict_lines

from .helpers import HOST_PYTHON, wind_down
from .test_stuck import _launch, _verdict_after_stall, line_of

pytestmark = pytest.mark.e2e
PROBE = ("import json, torch; print(json.dumps([torch.__version__, "
         "hasattr(torch._C._distributed_c10d, '_dump_fr_trace_json')]))")


def hosts_torch() -> tuple[str, bool]:
    """(the hosts' torch version, whether it has the flight-recorder dump the hook uses)."""
    out = subprocess.run([HOST_PYTHON, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    version, has = json.loads(out.stdout.strip().splitlines()[-1])
    return version, has


async def test_a_hung_rank_is_named_from_stacks_alone_and_the_verdict_says_so(tmp_path):
    version, has_recorder = hosts_torch()
    if has_recorder:
        pytest.skip("torch %s has a flight recorder (bench/compat.py runs this under 2.4)" % version)
    note = "flight recorder unavailable on torch %s: verdict from stacks alone" % version
    ctl = await _launch(tmp_path, ["--hang-at-step", "6", "--hang-rank", "2"])
    try:
        verdict = await _verdict_after_stall(ctl)
        assert verdict["kind"] == "stuck-in-python", verdict
        assert [s["rank"] for s in verdict["suspects"]] == [2], verdict
        assert verdict["suspects"][0]["frame"].endswith(
            "trainer/faults.py:%d in injected_hang" % line_of("time.sleep(3600)")), verdict
        assert verdict["summary"].startswith(note), verdict["summary"]
        assert verdict["evidence"]["waiting_ranks"] == [0, 1, 3], verdict["evidence"]
        assert evidence_lines(verdict)[0] == note  # `why`: verdict_lines, then these
        assert note in verdict_lines(verdict)[0]
        assert note in verdict_text(verdict).plain  # the view's verdict screen
        assert ctl.status()["verdict"] == verdict  # `status --json`
    finally:
        left = await wind_down(ctl)
    assert left == [], "processes left behind: %s" % left
