"""Node surgery over real SSH (docs/SURGERY.md): the session's 4 hosts that are not the laptop
(sshhosts.py), 3 in the run and node3 a spare that hosts the store and the judge (the hung
node and two that wait on it show it: each node more is two torch imports more at launch and
in the cordon's new world, and five hosts were a host set of their own). A rank hangs; the
run is left with no console, then `rankdeck cordon RUN --node N --yes` from a new shell takes
the hung rank's node out: the spare joins, every rank steps again from the checkpoint
(broadcast by the trainer: the hosts share no disk), and the cordoned node has no process of
the run left."""

from __future__ import annotations

import json
import os
import re
import pytest

from agent.host.journal import JournalReader
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.transport.ssh import SshTransport
from inventory.loader import load_inventory

from test_ssh_run import SCRIPT, secret, write_inventory  # noqa: F401
from spine.helpers import TINY, processes_of, wind_down  # noqa: E402
from spine.test_cordon import of_node  # noqa: E402
from tests.cli import rankdeck  # noqa: E402
from tests.waits import wait_for, wait_for_sync  # noqa: E402

pytestmark = pytest.mark.e2e
TIMEOUT = 300
SPARE = "node3"  # the last of the session's hosts; node0..node2 are the run's nodes


def steps(hosts, work: str, run_id: str, node: str) -> list[int]:
    path = hosts.local_path(node, "%s/.rankdeck/runs/%s/%s/journal" % (work, run_id, node))
    return [m["step"] for m, _d, _e in JournalReader(path).read(limit=64 << 20)
            if m.get("k") == "metric" and isinstance(m.get("step"), int)]


def new_world(run_id: str, hung: str) -> bool:
    """`rankdeck status RUN --json` after a cordon of ``hung`` with a spare: world 3, each
    rank 0-2 listed once and stepping past step 8, one on node3, none on ``hung``."""
    out = rankdeck("status", run_id, "--json")
    doc = json.loads(out.stdout)
    ranks = [(n["name"], r["rank"], r["state"], r["step"]) for n in doc["nodes"]
             for r in n["ranks"]]
    print("status:", doc.get("world_size"), ranks)
    return (doc.get("world_size") == 3 and sorted(r for _n, r, _s, _t in ranks) == [0, 1, 2]
            and all(s == "running" and (t or 0) > 8 for _n, _r, s, t in ranks)
            and SPARE in {n for n, *_ in ranks} and hung not in {n for n, *_ in ranks})


async def test_cordon_over_ssh_puts_the_spare_in_and_leaves_nothing_on_the_node(
        ssh_hosts, clean_home, tmp_path, secret, host_workdir, project):
    (clean_home / ".ssh").mkdir(exist_ok=True)
    (clean_home / ".ssh" / "config").write_text(open(ssh_hosts.ssh_config).read())
    work = host_workdir
    inv = load_inventory(write_inventory(tmp_path / "hosts.yaml", ssh_hosts, work, n=4))
    inv.mark_spares([SPARE])
    ctl = RunController(inv, SshTransport(
        ssh_config=ssh_hosts.ssh_config, known_hosts=ssh_hosts.known_hosts,
        client_keys=[ssh_hosts.client_key], remote_cache=ssh_hosts.remote_cache), History())
    st = ctl.state
    stopped = False
    try:
        await ctl.launch(LaunchSpec(script=SCRIPT, sync=str(project), max_restarts=5, grace=3,
                                    stall_after=6.0, args=TINY + [
                                        "--steps", "100000", "--ckpt-every", "4",
                                        "--hang-at-step", "6", "--hang-rank", "2",
                                        "--pg-timeout", "600"]), preflight=False)
        assert ctl.judge_host() == SPARE
        await wait_for(lambda: len(st.ranks) == 3 and all(
            r.state == "stalled" for r in st.ranks.values())
            and st.checkpoints.last_complete() is not None, TIMEOUT,
            lambda: "every rank stalled behind rank 2, the step-4 checkpoint complete: %s"
            % st.status())
        hung, run_id = st.ranks[2].node, ctl.run_id
        await ctl.close()  # no console left: the cordon comes from a new shell
        # the hang fires once per run: its marker is in the hung node's checkpoint folder,
        # which goes out with it (no shared disk), so the spare gets one, as a shared
        # folder would show it (trainer/faults.py); else rank 2 hangs again at step 6
        ssh_hosts.put_text(SPARE, "%s/.rankdeck/runs/%s/%s/ckpt/.fault-fired-hang-6-2"
                           % (work, run_id, SPARE), "")

        out = rankdeck("cordon", run_id, "--node", hung, "--yes")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "%s (spare" % SPARE in out.stdout and "done" in out.stdout, out.stdout
        # `done` only once the spare steps (agent/rules/cordon.py, the join step): at once,
        # the spare has its rank, running, and the cordoned node none (no stale rank of it)
        now = json.loads(rankdeck("status", run_id, "--json").stdout)
        ranks = {n["name"]: [(r["rank"], r["state"]) for r in n["ranks"]] for n in now["nodes"]}
        assert [s for _r, s in ranks[SPARE]] == ["running"] and not ranks[hung], ranks
        assert not of_node(run_id, hung), of_node(run_id, hung)
        fenced = ssh_hosts.local_path(hung, "%s/.rankdeck/runs/%s/%s/fenced.json"
                                       % (work, run_id, hung))
        assert os.path.exists(fenced)
        record = History().load(run_id)
        assert record["surgeries"][0]["outcome"] == "done", record["surgeries"]
        # the store (on the spare's host) took the node's dead torchrun out of the rendezvous
        assert record["surgeries"][0]["expelled"] == "done", record["surgeries"]
        assert record["surgeries"][0]["gpu"] == "no GPU"
        # ... kept in that host's action log, as `rankdeck actions` prints every node's
        acts = rankdeck("actions", run_id)
        assert acts.returncode == 0 and re.search(
            r"asked the store on %s \(to take %s's dead torchrun, pid \d+, out of the "
            r"rendezvous\): ok" % (SPARE, hung), acts.stdout), acts.stdout + acts.stderr
        # the spare's torchrun, held since launch, went in: a later console's start (no judge
        # token in its spec) is still the spec it held
        with open(ssh_hosts.local_path(SPARE, "%s/.rankdeck/runs/%s/%s/state.json"
                                       % (work, run_id, SPARE))) as f:
            spare = json.load(f)
        journal = ssh_hosts.local_path(SPARE, "%s/.rankdeck/runs/%s/%s/journal"
                                       % (work, run_id, SPARE))
        assert (spare["launches"], spare.get("warm")) == (1, True), [
            (m.get("what"), m.get("cause")) for m, _d, _e in JournalReader(journal).read()
            if m.get("k") == "event"]
        # the spare's rank and the three others step past the checkpoint they resumed from
        others = [n for n in ("node0", "node1", "node2") if n != hung]
        wait_for_sync(lambda: max(steps(ssh_hosts, work, run_id, SPARE) or [0]) > 8 and
                      all(max(steps(ssh_hosts, work, run_id, n)) > 8 for n in others),
                      TIMEOUT, "every rank past step 8, one on %s" % SPARE, every=1.0)
        # ... and `status --json` shows the new world: every rank once, stepping, one of
        # them on the spare, none left of the cordoned node (no stale rank of the old world)
        wait_for_sync(lambda: new_world(run_id, hung), 90,
                      "status --json: 3 ranks stepping, one on %s, none on %s" % (SPARE, hung),
                      every=2.0)
        out = rankdeck("stop", run_id)
        assert out.returncode == 0, out.stdout + out.stderr
        stopped = True
        wait_for_sync(lambda: not processes_of(run_id), 60, "every process of the run ended")
    finally:
        if not stopped:
            await wind_down(ctl)
