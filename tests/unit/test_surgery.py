"""Node surgery decided before anything is done (console/surgery/surgery.py), spares and the store's
host in the inventory (inventory/checks.py), and the verbs' refusals (console/verbs/cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.verbs.cli import main
from console.model.state import RunState
from console.model.nodes import RankState
from console.surgery.surgery import plan_cordon, ranks_text, store_host
from inventory.loader import load_inventory
from inventory.model import Inventory, InventoryError

from tests.local_nodes import local_inventory


def inventory(n=5, spares=(4,)) -> Inventory:
    return local_inventory(n=n, spares=spares, slots=2)


def run_state(inv: Inventory) -> RunState:
    st = RunState("run1", [(h.name, h.addr) for h in inv.hosts])
    for h in inv.spares:
        st.set_role(h.name, "spare")
    for i, h in enumerate(inv.active):
        for local in range(2):
            st.ranks[2 * i + local] = RankState(2 * i + local, h.name, local)
    return st


def test_a_spare_takes_the_nodes_place_and_the_preview_says_what_moves():
    inv = inventory()
    plan = plan_cordon(run_state(inv), inv, "4", "node2", store="node4")
    assert (plan.refusal, plan.spare, plan.shrink, plan.ranks_out) == (None, "node4", False, [4, 5])
    text = "\n".join(plan.lines())
    assert "ranks 4-5 leave node2" in text and "node4 (spare, 2 process(es))" in text
    assert "no complete checkpoint seen yet" in text


def test_the_preview_warns_when_the_store_lives_on_the_node_going_out():
    inv = inventory(4, spares=())
    plan = plan_cordon(run_state(inv), inv, "3:4", "node0", store="node0")
    assert "the rendezvous store and the judge stay on node0's host" in "\n".join(plan.lines())
    assert plan_cordon(run_state(inv), inv, "3:4", "node1", store="node0").store_note is None


def test_without_a_spare_a_static_run_refuses_and_an_elastic_one_shrinks():
    inv = inventory(4, spares=())
    st = run_state(inv)
    refused = plan_cordon(st, inv, "4", "node1")
    assert refused.refusal and "--nnodes 4 needs 4 node(s)" in refused.refusal
    assert refused.lines()[0] == "cordon node1: not possible, nothing was done:"
    assert [ns.role for ns in st.nodes.values()] == ["active"] * 4  # nothing changed
    shrink = plan_cordon(st, inv, "3:4", "node1")
    assert (shrink.refusal, shrink.shrink, shrink.active_after) == (None, True, 3)
    assert plan_cordon(st, inv, "4:4", "node0").refusal  # N:N is no room either


def test_what_cannot_be_cordoned_or_put_in_is_refused_with_the_reason():
    inv = inventory()
    st = run_state(inv)
    assert "no node 'node9'" in plan_cordon(st, inv, "4", "node9").refusal
    assert "node1 is in the run, not a spare" in plan_cordon(
        st, inv, "4", "node2", replace_with="node1").refusal
    st.set_role("node3", "cordoned")
    assert "cordoned already" in plan_cordon(st, inv, "4", "node3").refusal
    assert "cordoned, not a spare" in plan_cordon(st, inv, "4", "node2",
                                                  replace_with="node3").refusal


def test_a_spare_or_cordoned_node_shows_its_role_and_the_run_ends_without_it():
    inv = inventory()
    st = run_state(inv)
    st.set_node("node4", "connected")  # what a connect says: the role stays shown
    assert st.nodes["node4"].state == "spare"
    st.set_role("node2", "cordoned")
    for name in ("node0", "node1", "node3"):
        st.set_node(name, "exited")
    assert st.run_state() == "succeeded"


def test_the_store_lives_on_the_store_host_else_the_first_spare_else_the_first_host():
    inv = inventory()
    assert store_host(inv, inv.hosts).name == "node4"
    inv.store = "node1"
    assert store_host(inv, inv.hosts).name == "node1"
    assert store_host(inventory(3, spares=()), inventory(3, spares=()).hosts).name == "node0"


def test_ranks_in_words():
    assert (ranks_text([3]), ranks_text([5, 4]), ranks_text([1, 3])) == (
        "rank 3", "ranks 4-5", "ranks 1,3")


def load(tmp_path: Path, text: str) -> Inventory:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return load_inventory(path, {})


HOSTS = """transport: local
hosts:
  - {name: node0, addr: 127.0.0.2}
  - name: node1
    addr: 127.0.0.3
    spare: %s
"""


def test_inventory_spares_and_store(tmp_path):
    inv = load(tmp_path, HOSTS % "true" + "store: node1\n")
    assert [h.name for h in inv.spares] == ["node1"] and inv.store == "node1"
    with pytest.raises(InventoryError, match=r"inv.yaml:6: host 'node1': spare must be true "
                       r"or false, got 'yes'"):
        load(tmp_path, HOSTS % "'yes'")
    with pytest.raises(InventoryError, match=r"inv.yaml:7: store names host 'node9', which is "
                       r"not in hosts"):
        load(tmp_path, HOSTS % "false" + "store: node9\n")
    with pytest.raises(InventoryError, match="every host is a spare"):
        load(tmp_path, "transport: local\nhosts:\n  - {name: a, addr: 127.0.0.2, spare: true}\n")


def test_launch_spares_must_name_hosts_of_the_inventory(tmp_path, capsys):
    path = tmp_path / "inv.yaml"
    path.write_text(HOSTS % "false")
    code = main(["launch", "-i", str(path), "--spares", "node7", "--detach", "train.py"])
    assert code == 2 and "--spares: no host node7" in capsys.readouterr().err
    code = main(["launch", "-i", str(path), "--spares", "node0,node1", "--detach", "train.py"])
    assert code == 2 and "leaves no host to train on" in capsys.readouterr().err


def test_a_run_deepspeed_started_is_not_cordoned_no_node_leaves_its_static_world():
    from console.launch.spec import STATIC_WORLD
    inv = inventory()
    plan = plan_cordon(run_state(inv), inv, "4", "node2", store="node4",
                       static_world=STATIC_WORLD["deepspeed"])
    assert plan.refusal.startswith("cannot cordon a node of run ")
    assert "DeepSpeed's launcher starts one static world" in "\n".join(plan.lines())
    assert plan.spare is None and plan.ranks_out == []


def test_a_cordon_the_judge_did_itself_changes_the_roles_a_console_shows():
    """--auto-cordon (agent/judge/cordon.py): the judge's outcome event, read from its
    journal (console/judgement/judged.py), makes the node cordoned and the spare active, and is kept for
    the run record; a console's own surgery events change nothing here."""
    from console.judgement.judged import apply_judge_records
    inv = inventory()
    st = run_state(inv)
    console_made = {"k": "event", "what": "surgery", "who": "alice@laptop", "action": "outcome",
                    "out": "node1", "in": "node4", "text": "cordon node1, spare node4 in: done"}
    apply_judge_records(st, [(console_made,)], 0, "node4")
    assert st.nodes["node1"].role == "active" and st.judge_surgeries == []
    judge_made = dict(console_made, who="judge", outcome="done", fenced=True, left=[],
                      gpu="no GPU", ts=1700000000.0)
    apply_judge_records(st, [(judge_made,)], 0, "node4")
    assert (st.nodes["node1"].role, st.nodes["node4"].role) == ("cordoned", "active")
    assert st.judge_surgeries == [{
        "who": "judge", "what": "cordon node1, spare node4 in", "node": "node1",
        "spare": "node4", "when": 1700000000.0, "outcome": "done", "gpu": "no GPU", "left": []}]
    # not fenced, the spare not started: nothing changes but the record's line
    st2 = run_state(inv)
    apply_judge_records(st2, [(dict(judge_made, outcome="failed: node1 could not be fenced: x",
                                    fenced=False),)], 0, "node4")
    assert (st2.nodes["node1"].role, st2.nodes["node4"].role) == ("active", "spare")
    assert st2.judge_surgeries[0]["outcome"].startswith("failed")


async def test_a_cordon_whose_node_or_spare_is_not_connected_does_nothing():
    """console/surgery/cordon.py: refused before the judge hears of it (`c` in the view and the CLI
    say the same reason; the CLI exits 3)."""
    import types

    from console.surgery.cordon import cordon, unreachable
    inv = inventory()
    plan = plan_cordon(run_state(inv), inv, "4", "node2", store="node4")
    told = []
    ctl = types.SimpleNamespace(connected=lambda: ["node0", "node1", "node2", "node3", "node4"],
                                judge_host=lambda: told.append("judge"))
    assert unreachable(ctl, plan) is None
    ctl.connected = lambda: ["node0", "node1", "node2", "node3"]  # the spare is away
    assert unreachable(ctl, plan).startswith("cannot reach node4: a cordon must fence")
    with pytest.raises(ValueError, match="cannot reach node4"):
        await cordon(ctl, plan, who="alice@laptop")
    assert told == []  # the judge was not told: nothing changed


async def test_a_console_keeps_the_judges_cordon_in_the_run_record():
    """console/surgery/autocordon.py follow_judge: the judge's surgery (read from its journal) goes
    into the run record once: roles, the node-rank order with the spare in the node's place,
    ``surgeries`` with who = judge."""
    from console.surgery.autocordon import follow_judge
    from console.records.history import History
    from console.judgement.judged import apply_judge_records
    from console.run.run import RunController
    from console.transport.local import LocalTransport
    inv = inventory()
    ctl = RunController(inv, LocalTransport(), History(), run_id="20260101-000000-abcd")
    ctl.record = {"run_id": ctl.run_id, "created": 0, "transport": "local", "hosts": [],
                  "spec": {"script": "t.py"}, "roles": {"node4": "spare"},
                  "order": ["node0", "node1", "node2", "node3"], "surgeries": []}
    done = {"k": "event", "what": "surgery", "who": "judge", "action": "outcome", "out": "node1",
            "in": "node4", "outcome": "done", "fenced": True, "left": [], "gpu": "freed",
            "ts": 1700000000.0, "text": "cordon node1, spare node4 in: done; GPU: freed"}
    apply_judge_records(ctl.state, [(done,)], 0, "node4")
    await follow_judge(ctl)
    await follow_judge(ctl)  # once
    saved = History().load(ctl.run_id)
    assert saved["roles"] == {"node1": "cordoned"}
    assert saved["order"] == ["node0", "node4", "node2", "node3"]
    assert [(s["who"], s["node"], s["spare"], s["outcome"]) for s in saved["surgeries"]] == [
        ("judge", "node1", "node4", "done")]
