"""`launch --on-nan stop`: real torchrun on 2 local nodes, launched with `--detach` and left
with no console. A rank's loss turns NaN at step 8; the judge on the rendezvous host stops
the run, says which rank on which node at which step, and every line the ranks printed
before the stop is in their node's journal (nothing lost)."""

from __future__ import annotations

import json

import pytest

from agent.host.journal import JournalReader
from agent.store.tcpstore import STORE_SCRIPT

from tests.cli import UNBUFFERED, rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import all_ended, processes_of
from .test_judge import wait_for_event

pytestmark = pytest.mark.e2e

# each rank prints a step a tenth of a second, its loss NaN from step 8 (rank 1 only), and
# keeps on until stopped; it also notes every line it printed, after printing it
SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
noted = open(os.path.join(sys.argv[1], "printed-%d" % rank), "a")
step = 0
while True:
    step += 1
    loss = "nan" if rank == 1 and step >= 8 else "%.4f" % (1.0 / step)
    line = "rank %d step=%d loss=%s" % (rank, step, loss)
    print(line, flush=True)
    noted.write(line + "\\n")
    noted.flush()
    time.sleep(0.1)
"""


def test_on_nan_stop_stops_the_run_at_the_first_nan_and_loses_no_line(tmp_path):
    workdir, noted = tmp_path / "work", tmp_path / "noted"
    noted.mkdir()
    script = tmp_path / "diverge.py"
    script.write_text(SCRIPT)
    inv = write_inventory(tmp_path, workdir, 2)
    out = rankdeck("launch", "--detach", "--skip-preflight", "--on-nan", "stop", "-i", inv, str(script),
                   "--", str(noted), env=UNBUFFERED)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = out.stdout.strip().splitlines()[-1]
    try:
        ended = wait_for_event(str(workdir), run_id, lambda e: e["what"] == "run_ended",
                               "the end")
        assert ended[0]["state"] == "stopped", ended
        policy = wait_for_event(str(workdir), run_id, lambda e: e["what"] == "policy",
                                "the --on-nan policy")
        node = policy[0]["node"]
        assert policy[0]["rank"] == 1 and policy[0]["step"] == 8, policy
        assert "rank 1 on %s diverged at step 8" % node in policy[0]["text"], policy
        status = json.loads(rankdeck("status", run_id, "--json", env=UNBUFFERED).stdout)
        assert status["state"] == "stopped", status["state"]
        ranks = {r["rank"]: r for n in status["nodes"] for r in n["ranks"]}
        assert ranks[1]["diverged"] == 8, ranks[1]
        # the stop's end: every process of the run gone but its store, which stops itself
        # once it has seen no node for 15 s (tests/spine/test_judge.py's max-wall test)
        wait_for_sync(lambda: not [c for _p, c in processes_of(run_id) if STORE_SCRIPT not in c],
                      60, lambda: "the run's processes to end: %s" % processes_of(run_id),
                      every=0.5)
        root = workdir / ".rankdeck" / "runs" / run_id
        journaled = set()
        for name in ("node0", "node1"):
            for _m, data, _e in JournalReader(str(root / name / "journal")).read(1 << 30):
                journaled.update((data or b"").decode(errors="replace").splitlines())
        for rank in (0, 1):
            printed = (noted / ("printed-%d" % rank)).read_text().splitlines()
            assert printed and any("loss=nan" in line for line in
                                   (noted / "printed-1").read_text().splitlines())
            lost = [line for line in printed if line not in journaled]
            assert lost == [], "rank %d's lines not in the journal: %s" % (rank, lost[:5])
    finally:
        if processes_of(run_id):
            rankdeck("stop", run_id, env=UNBUFFERED)
        all_ended(run_id)
