"""The inventory loader: the shipped examples, and the message a user gets for each mistake."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from inventory.loader import load_hostfile, load_inventory
from inventory.model import EnvValue, Inventory, InventoryError

EXAMPLES = Path(__file__).resolve().parents[2] / "inventory"
LAPTOP_ENV = {"WANDB_API_KEY": "wk-123", "USER": "alice", "HOME": "/home/alice"}


def comparable(inv: Inventory) -> Inventory:
    """The inventory without where it came from (path, line numbers)."""
    hosts = [dataclasses.replace(h, line=0) for h in inv.hosts]
    return dataclasses.replace(inv, path="", hosts=hosts)


def load_text(tmp_path: Path, name: str, text: str, environ=None) -> Inventory:
    (tmp_path / name).write_text(text)
    return load_inventory(tmp_path / name, environ or {})


# --- the examples ------------------------------------------------------------------------


def test_cluster_example_yaml_merges_defaults_into_each_host():
    inv = load_inventory(EXAMPLES / "cluster.example.yaml", LAPTOP_ENV)
    assert (inv.name, inv.transport) == ("gpu-cluster", "ssh")
    assert [h.name for h in inv.hosts] == ["node0", "node1", "node2", "node3"]
    node0, node1, node2, node3 = inv.hosts
    assert (node0.ssh, node0.addr) == ("gpu-node-0", "10.0.0.10")
    assert (node1.ssh, node1.addr) == ("gpu-node-1", "10.0.0.11")
    assert (node2.ssh, node2.addr) == ("alice@10.0.0.12:2222", "10.0.0.12")
    assert (node3.ssh, node3.addr) == ("alice@10.0.0.13", "10.0.0.13")
    for host in (node0, node1, node2):
        assert (host.python, host.workdir, host.slots, host.gpus) == (
            "/opt/venv/bin/python", "~/work/proj", 8, 8)
    assert (node3.python, node3.workdir, node3.slots, node3.gpus) == (
        "/usr/bin/python3.11", "/scratch/alice/proj", 4, 4)
    assert node0.line == 24


def test_cluster_example_yaml_env_values_and_secret_flags():
    inv = load_inventory(EXAMPLES / "cluster.example.yaml", LAPTOP_ENV)
    shared = {
        "NCCL_DEBUG": EnvValue("WARN"),
        "NCCL_SOCKET_NTHREADS": EnvValue("4"),
        "WANDB_API_KEY": EnvValue("wk-123", secret=True),
        "WANDB_PROJECT": EnvValue("rankdeck"),  # fallback used: nothing secret in it
        "RUN_NAME": EnvValue("exp-alice", secret=True),
        "HYDRA_RUN_DIR": EnvValue("out/${now:%H-%M}"),
    }
    assert inv.host("node0").env == shared
    assert inv.host("node2").env == {**shared, "NCCL_DEBUG": EnvValue("INFO")}
    assert inv.host("node3").env == {
        **shared,
        "HF_TOKEN": EnvValue("", secret=True),
        "HOME_DIR": EnvValue("/home/alice", secret=False),
    }
    assert inv.secrets == ["alice", "exp-alice", "wk-123"]  # what ${USER} filled in too


def test_cluster_example_fallback_takes_the_environment_when_set():
    env = {**LAPTOP_ENV, "WANDB_PROJECT": "mine", "HF_TOKEN": "hf-9"}
    inv = load_inventory(EXAMPLES / "cluster.example.yaml", env)
    assert inv.host("node0").env["WANDB_PROJECT"] == EnvValue("mine", secret=True)
    assert inv.host("node3").env["HF_TOKEN"] == EnvValue("hf-9", secret=True)


def test_yaml_and_toml_examples_are_the_same_inventory():
    from_yaml = load_inventory(EXAMPLES / "cluster.example.yaml", LAPTOP_ENV)
    from_toml = load_inventory(EXAMPLES / "cluster.example.toml", LAPTOP_ENV)
    assert comparable(from_toml) == comparable(from_yaml)
    assert [h.line for h in from_toml.hosts] == [25, 30, 35, 42]  # the [[hosts]] headers


def test_local_example_runs_four_nodes_on_loopback_with_the_console_python():
    inv = load_inventory(EXAMPLES / "local.yaml", {})
    assert inv.transport == "local"
    assert [(h.name, h.addr) for h in inv.hosts] == [
        ("node0", "127.0.0.2"), ("node1", "127.0.0.3"),
        ("node2", "127.0.0.4"), ("node3", "127.0.0.5"),
    ]
    for host in inv.hosts:
        assert (host.ssh, host.python, host.workdir, host.slots, host.env) == (None, "", ".", 1, {})


def test_local_workdirs_are_fixed_against_the_launch_directory(tmp_path):
    # a local run's folders must not move when a later command starts elsewhere
    local = load_inventory(EXAMPLES / "local.yaml", {}).resolve_local(str(tmp_path))
    assert {h.workdir for h in local.hosts} == {str(tmp_path)}
    remote = load_inventory(EXAMPLES / "cluster.example.yaml", LAPTOP_ENV)
    before = [h.workdir for h in remote.hosts]
    assert [h.workdir for h in remote.resolve_local(str(tmp_path)).hosts] == before


def test_hostfile_example_takes_python_workdir_and_gpus_from_defaults():
    defaults = {"python": "/opt/venv/bin/python", "workdir": "~/proj", "gpus": 8,
                "env": {"TOKEN": "${WANDB_API_KEY}"}}
    inv = load_hostfile(EXAMPLES / "hostfile.example", LAPTOP_ENV, defaults)
    assert [(h.name, h.ssh, h.addr, h.slots, h.line) for h in inv.hosts] == [
        ("gpu-node-0", "gpu-node-0", "gpu-node-0", 8, 5),
        ("gpu-node-1", "gpu-node-1", "gpu-node-1", 8, 6),
        ("gpu-node-2", "gpu-node-2", "gpu-node-2", 8, 7),
        ("gpu-node-3", "gpu-node-3", "gpu-node-3", 4, 8),
    ]
    assert all((h.python, h.workdir, h.gpus) == ("/opt/venv/bin/python", "~/proj", 8)
               for h in inv.hosts)
    assert inv.hosts[0].env == {"TOKEN": EnvValue("wk-123", secret=True)}
    # load_inventory reads anything that is not .yaml/.toml as a hostfile, with plain defaults.
    plain = load_inventory(EXAMPLES / "hostfile.example", {})
    assert (plain.hosts[0].python, plain.hosts[0].workdir, plain.transport) == ("python3", "~", "ssh")


# --- behaviour -----------------------------------------------------------------------------


def test_ssh_defaults_name_and_addr_from_the_target(tmp_path):
    inv = load_text(tmp_path, "inv.yaml", """\
hosts:
  - name: a
  - name: b
    ssh: bob@b.example:2200
  - name: c
    ssh: "[fd00::3]:22"
  - name: d
    ssh: fd00::4
""")
    assert [(h.ssh, h.addr, h.python, h.workdir, h.slots, h.gpus) for h in inv.hosts] == [
        ("a", "a", "python3", "~", 1, 0),
        ("bob@b.example:2200", "b.example", "python3", "~", 1, 0),
        ("[fd00::3]:22", "fd00::3", "python3", "~", 1, 0),
        ("fd00::4", "fd00::4", "python3", "~", 1, 0),
    ]


def test_env_values_keep_their_spelling_and_dollar_rules(tmp_path):
    inv = load_text(tmp_path, "inv.yaml", """\
hosts:
  - name: a
    workdir: ~
    env:
      VERSION: 3.10
      MODE: 0700
      PRICE: $5 and $$ and $${X}
      EMPTY_SET: ${EMPTY:-fallback}
      EMPTY_RAW: ${EMPTY}
      SHOWN: {value: "${TOKEN}", secret: false}
      HIDDEN: {value: plain, secret: true}
""", environ={"EMPTY": "", "TOKEN": "t0k"})
    host = inv.hosts[0]
    assert host.workdir == "~"  # YAML's bare ~ is null; here it means home
    assert host.env == {
        "VERSION": EnvValue("3.10"),
        "MODE": EnvValue("0700"),
        "PRICE": EnvValue("$5 and $$ and ${X}"),
        "EMPTY_SET": EnvValue("fallback"),
        "EMPTY_RAW": EnvValue("", secret=True),
        "SHOWN": EnvValue("t0k", secret=False),
        "HIDDEN": EnvValue("plain", secret=True),
    }


def test_yaml_anchors_and_merge_keys_work(tmp_path):
    inv = load_text(tmp_path, "inv.yaml", """\
hosts:
  - &big {name: a, slots: 8, gpus: 8}
  - <<: *big
    name: b
""")
    assert [(h.name, h.slots, h.gpus) for h in inv.hosts] == [("a", 8, 8), ("b", 8, 8)]


def test_environ_defaults_to_the_process_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANKDECK_TEST_SECRET", "s3")
    (tmp_path / "inv.yaml").write_text(
        "hosts:\n  - name: a\n    env: {K: \"${RANKDECK_TEST_SECRET}\"}\n")
    inv = load_inventory(str(tmp_path / "inv.yaml"))
    assert inv.hosts[0].env == {"K": EnvValue("s3", secret=True)}


def test_toml_semantic_errors_point_at_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("inv.toml").write_text("""\
[[hosts]]
name = "a"

[[hosts]]
name = "b"
env = { A = "1", B = { value = "x", secert = true } }
""")
    with pytest.raises(InventoryError) as err:
        load_inventory("inv.toml", {})
    assert str(err.value) == (
        "inv.toml:6: unknown key 'secert' in env B of host 'b'; did you mean 'secret'? "
        "Allowed: secret, value")
    assert (err.value.path, err.value.line) == ("inv.toml", 6)


# --- every mistake: file, line, what is wrong, how to fix it ---------------------------------

HOST = "hosts:\n  - name: node0\n"
CATALOGUE = [
    ("yaml-syntax", "inv.yaml", "hosts:\n  - name: node0\n    ssh: gpu: 0\n",
     "inv.yaml:3: YAML syntax error: mapping values are not allowed here; check indentation "
     "and quote values that contain ': '"),
    ("yaml-tab", "inv.yaml", "hosts:\n\t- name: node0\n",
     "inv.yaml:2: YAML syntax error: found character '\\t' that cannot start any token; indent "
     "with spaces (YAML does not allow tabs), and quote values that start with '@' or '`'"),
    ("yaml-braces", "inv.yaml", HOST + "    env: {K: ${X}}\n",
     "inv.yaml:3: YAML syntax error: expected ',' or '}', but got '{'; inside { } quote "
     "values that contain braces, e.g. {K: \"${VAR}\"}"),
    ("toml-syntax", "inv.toml", "[[hosts]]\nname = node0\n",
     "inv.toml:2: TOML syntax error: invalid value at column 8; text needs quotes in TOML: "
     "key = \"value\""),
    ("unknown-top", "inv.yaml", "host:\n  - name: node0\n",
     "inv.yaml:1: unknown key 'host' at the top level; did you mean 'hosts'? Allowed: "
     "defaults, hosts, launcher, name, notify, prometheus, store, transport"),
    ("unknown-defaults", "inv.yaml", "defaults:\n  slot: 8\n" + HOST,
     "inv.yaml:2: unknown key 'slot' in defaults; did you mean 'slots'? Allowed: env, gpus, "
     "python, slots, sync, workdir"),
    ("ssh-in-defaults", "inv.yaml", "defaults:\n  ssh: gw\n" + HOST,
     "inv.yaml:2: 'ssh' cannot be a default: every host has its own; set it on each host"),
    ("unknown-host", "inv.yaml", HOST + "  - name: node1\n    adr: 10.0.0.11\n",
     "inv.yaml:4: unknown key 'adr' in host 'node1'; did you mean 'addr'? Allowed: addr, env, "
     "gpus, name, python, slots, spare, ssh, workdir"),
    ("unknown-no-match", "inv.yaml", HOST + "    colour: red\n",
     "inv.yaml:3: unknown key 'colour' in host 'node0'; allowed: addr, env, gpus, name, "
     "python, slots, spare, ssh, workdir"),
    ("unknown-env-form", "inv.yaml", HOST + "    env:\n      T: {value: x, secert: true}\n",
     "inv.yaml:4: unknown key 'secert' in env T of host 'node0'; did you mean 'secret'? "
     "Allowed: secret, value"),
    ("unknown-toml-host", "inv.toml",
     '[[hosts]]\nname = "node0"\n\n[[hosts]]\nname = "node1"\nadr = "10.0.0.11"\n',
     "inv.toml:6: unknown key 'adr' in host 'node1'; did you mean 'addr'? Allowed: addr, env, "
     "gpus, name, python, slots, spare, ssh, workdir"),
    ("duplicate-name", "inv.yaml",
     "hosts:\n  - name: node1\n    addr: 10.0.0.1\n  - name: node1\n    addr: 10.0.0.2\n",
     "inv.yaml:4: duplicate host name 'node1' (first defined on line 2); host names must be "
     "unique"),
    ("duplicate-addr", "inv.yaml",
     "hosts:\n  - name: a\n    ssh: u@box:2201\n  - name: b\n    ssh: u@box:2202\n",
     "inv.yaml:5: host 'b' has the same addr 'box' as host 'a' (line 2); each node needs its "
     "own address (it is the node's --local-addr), so give each host a distinct 'addr:'"),
    ("duplicate-key", "inv.yaml", HOST + "    slots: 2\n    gpus: 2\n    slots: 4\n",
     "inv.yaml:5: duplicate key 'slots' (first on line 3); YAML would keep only the last one, "
     "so remove or rename one of them"),
    ("missing-name", "inv.yaml", HOST + "  - ssh: gpu-node-1\n",
     "inv.yaml:3: host #2 has no name; add 'name: <name>' (host names must be unique)"),
    ("bad-name", "inv.yaml", "hosts:\n  - name: node 0\n",
     "inv.yaml:2: host name 'node 0' is not valid; use letters, digits, '.', '_' and '-', "
     "starting with a letter or digit"),
    ("number-name", "inv.yaml", "hosts:\n  - name: 007\n",
     "inv.yaml:2: host #1: name must be text, got 007; put it in quotes: \"007\""),
    ("no-hosts", "inv.yaml", "name: empty\nhosts: []\n",
     "inv.yaml:2: no hosts; add a hosts list with at least one host (see "
     "inventory/cluster.example.yaml)"),
    ("hosts-not-list", "inv.yaml", "hosts:\n  node0: {}\n",
     "inv.yaml:1: hosts must be a list of hosts, each starting with '- name:', got a mapping"),
    ("slots-text", "inv.yaml", HOST + "    slots: eight\n",
     "inv.yaml:3: host 'node0': slots must be a whole number >= 1, got 'eight'"),
    ("slots-quoted", "inv.yaml", HOST + "    slots: \"8\"\n",
     "inv.yaml:3: host 'node0': slots must be a whole number >= 1, got '8'; remove the quotes"),
    ("slots-zero", "inv.yaml", "defaults:\n  slots: 0\n" + HOST,
     "inv.yaml:2: defaults: slots must be a whole number >= 1, got 0"),
    ("slots-huge", "inv.yaml", HOST + "    slots: 1000000\n",
     "inv.yaml:3: host 'node0': slots is 1000000; more than 1024 on one node is surely a "
     "typo (a node's GPU count is e.g. 8)"),
    ("addr-with-port", "inv.yaml", HOST + "    addr: 10.0.0.1:29500\n",
     "inv.yaml:3: host 'node0': addr '10.0.0.1:29500' has a port; addr is the node's address "
     "alone (10.0.0.1), the rendezvous port is rankdeck's to choose"),
    ("addr-brackets", "inv.yaml", HOST + "    addr: \"[fd00::1]\"\n",
     "inv.yaml:3: host 'node0': addr '[fd00::1]' has brackets; write the address alone: "
     "fd00::1"),
    ("addr-not-a-name", "inv.yaml", HOST + "    addr: -oProxyCommand=x\n",
     "inv.yaml:3: host 'node0': addr '-oProxyCommand=x' is not a hostname or IP address; use "
     "letters, digits, '.', '_' and '-', starting with a letter or digit"),
    ("ssh-option", "inv.yaml", HOST + "    ssh: -oProxyCommand=touch /tmp/x\n",
     "inv.yaml:3: host 'node0': ssh '-oProxyCommand=touch /tmp/x' starts with '-', which ssh "
     "would read as an option; write [user@]host[:port] or an ~/.ssh/config alias"),
    ("env-nul", "inv.yaml", HOST + "    env:\n      A: \"x\\0y\"\n",
     "inv.yaml:4: host 'node0': env A contains a NUL character, which no environment variable "
     "can hold; remove it"),
    ("gpus-bool", "inv.yaml", HOST + "    gpus: yes\n",
     "inv.yaml:3: host 'node0': gpus must be a whole number >= 0, got yes (a boolean)"),
    ("slots-bool-toml", "inv.toml", '[[hosts]]\nname = "node0"\nslots = true\n',
     "inv.toml:3: host 'node0': slots must be a whole number >= 1, got true (a boolean)"),
    ("undefined-var", "inv.yaml",
     HOST + "  - name: node1\n    env:\n      WANDB_API_KEY: ${WANDB_API_KEY}\n",
     "inv.yaml:5: environment variable WANDB_API_KEY is not set on this machine (used by "
     "hosts.node1.env.WANDB_API_KEY); export it, or write ${WANDB_API_KEY:-default}"),
    ("undefined-var-toml", "inv.toml",
     '[defaults]\nslots = 2\n\n[defaults.env]\nA = "1"\nKEY = "x-${KEY}"\n\n'
     '[[hosts]]\nname = "node0"\n',
     "inv.toml:6: environment variable KEY is not set on this machine (used by "
     "defaults.env.KEY); export it, or write ${KEY:-default}"),
    ("unclosed-ref", "inv.yaml", HOST + "    env:\n      A: x${Y\n",
     "inv.yaml:4: unclosed '${' in hosts.node0.env.A; close it with '}', or write '$${' for a "
     "literal '${'"),
    ("bad-ref", "inv.yaml", HOST + "    env:\n      A: ${1X}\n",
     "inv.yaml:4: '${1X}' in hosts.node0.env.A is not a valid reference; write ${NAME} or "
     "${NAME:-fallback}, or '$${' for a literal '${'"),
    ("bad-env-name", "inv.yaml", HOST + "    env:\n      MY-VAR: x\n",
     "inv.yaml:4: host 'node0': 'MY-VAR' is not a valid environment variable name; use "
     "letters, digits and '_', not starting with a digit"),
    ("env-bool", "inv.yaml", HOST + "    env:\n      DEBUG: true\n",
     "inv.yaml:4: host 'node0': env DEBUG is true (a boolean); environment values are text, "
     "so quote it: \"true\""),
    ("env-secret-not-bool", "inv.yaml", HOST + "    env:\n      T:\n        value: x\n"
     "        secret: maybe\n",
     "inv.yaml:6: host 'node0': env T: secret must be true or false, got 'maybe'"),
    ("local-with-ssh", "inv.yaml",
     "transport: local\nhosts:\n  - name: node0\n    ssh: gpu-node-0\n    addr: 127.0.0.2\n",
     "inv.yaml:4: host 'node0' sets ssh, but transport is local (every node runs on this "
     "machine); remove 'ssh:' or set 'transport: ssh'"),
    ("local-no-addr", "inv.yaml", "transport: local\n" + HOST,
     "inv.yaml:3: host 'node0' needs an addr with transport local: a loopback address of its "
     "own, such as 127.0.0.2"),
    ("local-not-loopback", "inv.yaml",
     "transport: local\nhosts:\n  - name: node0\n    addr: 10.0.0.10\n",
     "inv.yaml:4: host 'node0': addr '10.0.0.10' is not a loopback address; with transport "
     "local every node runs on this machine, so use 127.0.0.2, 127.0.0.3, ..."),
    ("bad-transport", "inv.yaml", "transport: sssh\n" + HOST,
     "inv.yaml:1: transport must be 'ssh' or 'local', got 'sssh'; did you mean 'ssh'?"),
    ("bad-port", "inv.yaml", HOST + "    ssh: me@gpu:22x\n",
     "inv.yaml:3: host 'node0': ssh 'me@gpu:22x' is not an ssh target; write an "
     "~/.ssh/config alias or [user@]host[:port] with a port from 1 to 65535"),
    ("top-is-list", "inv.yaml", "- name: node0\n",
     "inv.yaml:1: the top level must be a mapping with a hosts list, got a list (see "
     "inventory/cluster.example.yaml)"),
    ("empty-yaml", "inv.yaml", "",
     "inv.yaml: the file is empty; an inventory needs a list of hosts (see "
     "inventory/cluster.example.yaml)"),
    ("only-comments", "inv.yaml", "# todo\n",
     "inv.yaml: the file is empty; an inventory needs a list of hosts (see "
     "inventory/cluster.example.yaml)"),
    ("missing-file", "missing.yaml", None, "missing.yaml: no such file"),
    ("hostfile-bad-slots", "hosts", "node0 slots=8\nnode1 slots=eight\n",
     "hosts:2: slots must be a whole number from 1 to 1024, got 'eight'; write e.g. "
     "'node1 slots=8'"),
    ("hostfile-huge-slots", "hosts", "node0 slots=1000000\n",
     "hosts:1: slots must be a whole number from 1 to 1024, got '1000000'; write e.g. "
     "'node0 slots=8'"),
    ("hostfile-spaced-slots", "hosts", "# gpus\nnode0 slots = 8\n",
     "hosts:2: unexpected 'slots' after 'node0'; a hostfile line is 'hostname slots=N', e.g. "
     "'node0 slots=8'"),
    ("hostfile-duplicate", "hosts", "node0 slots=8\n\n# again\nnode0 slots=4\n",
     "hosts:4: duplicate host name 'node0' (first defined on line 1); host names must be "
     "unique"),
    ("hostfile-user", "hosts", "root@node0 slots=8\n",
     "hosts:1: 'root@node0' is not a valid host name; use letters, digits, '.', '_' and '-' "
     "(for a user or port, use an ~/.ssh/config alias or a YAML inventory)"),
    ("hostfile-empty", "hosts", "# nothing yet\n",
     "hosts: no hosts in this hostfile; add one line per host, e.g. 'node0 slots=8'"),
]


@pytest.mark.parametrize("name, text, message", [c[1:] for c in CATALOGUE],
                         ids=[c[0] for c in CATALOGUE])
def test_each_mistake_gets_file_line_and_fix(tmp_path, monkeypatch, name, text, message):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        Path(name).write_text(text)
    with pytest.raises(InventoryError) as err:
        load_inventory(name, {})
    assert str(err.value) == message


# --- files that are not inventories --------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InventoryError) as err:
        load_inventory(fifo, {})
    assert "not a regular file" in str(err.value) and str(fifo) in str(err.value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["cluster.yaml", "hostfile"])
def test_a_device_is_refused_unread(tmp_path, name):
    (tmp_path / name).symlink_to("/dev/zero")
    with pytest.raises(InventoryError) as err:
        load_inventory(tmp_path / name, {})
    assert "not a regular file" in str(err.value)


def test_a_file_over_the_size_cap_is_refused(tmp_path):
    (tmp_path / "cluster.yaml").write_text("# padding\n" * (1 << 17))
    with pytest.raises(InventoryError) as err:
        load_inventory(tmp_path / "cluster.yaml", {})
    assert "larger than 1 MiB" in str(err.value)


def test_a_byte_that_is_not_utf8_is_named_with_its_line(tmp_path):
    (tmp_path / "cluster.yaml").write_bytes(b"hosts:\n  - name: n\xe9ud0\n    ssh: a\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(tmp_path / "cluster.yaml", {})
    assert err.value.line == 2
    assert "cluster.yaml:2:" in str(err.value) and "0xe9" in str(err.value)
    assert "save the file as UTF-8" in str(err.value)


@pytest.mark.timeout(30)
def test_nested_merge_keys_are_bounded(tmp_path):
    # each level merges the one before and names it twice more: 3^25 values if expanded
    levels = ["l0: &l0 {k0: v}"] + ["l%d: &l%d {<<: *l%d, a%d: *l%d, b%d: *l%d}"
                                    % (i, i, i - 1, i, i - 1, i, i - 1) for i in range(1, 26)]
    text = "\n".join(levels) + "\nhosts:\n  - name: n0\n"
    with pytest.raises(InventoryError) as err:
        load_text(tmp_path, "cluster.yaml", text)
    assert "expand this to more than" in str(err.value) and err.value.line is not None


def test_an_alias_inside_itself_is_refused(tmp_path):
    with pytest.raises(InventoryError) as err:
        load_text(tmp_path, "cluster.yaml", "hosts: &h\n  - name: n0\n  - *h\n")
    assert "recursive" in str(err.value)


@pytest.mark.parametrize("name,text,line", [
    ("big.yaml", "hosts:\n  - {name: n0, addr: 10.0.0.1, slots: %s}\n" % ("9" * 5000), 2),
    ("big.toml", '[[hosts]]\nname = "n0"\naddr = "10.0.0.1"\nslots = %s\n' % ("9" * 5000), 4),
], ids=["yaml", "toml"])
def test_a_number_past_4300_digits_is_a_file_line_error(tmp_path, name, text, line):
    """Python refuses to convert such a digit string (int_max_str_digits): it was a
    ValueError traceback instead of file:line."""
    with pytest.raises(InventoryError) as err:
        load_text(tmp_path, name, text)
    assert err.value.line == line and "5000 digits" in str(err.value), str(err.value)


def test_a_hostfile_slots_past_4300_digits_is_a_line_error_that_does_not_repeat_it(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("n0 slots=%s\n" % ("9" * 5000))
    with pytest.raises(InventoryError) as err:
        load_hostfile(str(path))
    assert err.value.line == 1 and "5000 characters" in str(err.value)
    assert len(str(err.value)) < 300


def test_every_variable_filled_into_a_secret_is_a_secret_too(tmp_path):
    # only the whole value used to be secret: the token printed alone was shown in clear
    inv = load_text(tmp_path, "inv.yaml", """\
hosts:
  - name: a
    env:
      AUTH: "Bearer ${TOKEN}"
      URL: "https://bob:${PASS}@db.example:5432/x"
      MIRROR: "${BASE:-https://pypi.org}/simple"
      SHOWN: {value: "user ${WHO}", secret: false}
""", environ={"TOKEN": "tk-5a8f0c2e91", "PASS": "pw-77c1d0e4b2", "WHO": "alice"})
    assert inv.secrets == sorted(["Bearer tk-5a8f0c2e91", "tk-5a8f0c2e91",
                                  "https://bob:pw-77c1d0e4b2@db.example:5432/x",
                                  "pw-77c1d0e4b2"])
    env = inv.hosts[0].env
    assert env["AUTH"].parts == ("tk-5a8f0c2e91",)
    assert env["MIRROR"] == EnvValue("https://pypi.org/simple")  # nothing from the laptop
    assert env["SHOWN"].parts == ("alice",) and not env["SHOWN"].secret


def test_notify_is_a_top_level_command_and_launch_takes_it(tmp_path):
    """`notify:` in the inventory is the judge's notification command (docs/JUDGE.md) unless
    `launch --notify` gives another."""
    import argparse

    from console.launch.options import judge_settings
    inv = load_text(tmp_path, "n.yaml", "notify: ~/bin/rankdeck-webhook\n"
                    "hosts:\n  - {name: n0, addr: 10.0.0.1}\n")
    assert inv.notify == "~/bin/rankdeck-webhook"
    args = argparse.Namespace(stall_after=None, on_hang="warn", max_wall=None, notify=None,
                              notify_on="stall,verdict")
    settings = judge_settings(args, inv)
    assert settings["notify"] == "~/bin/rankdeck-webhook"
    assert settings["notify_on"] == ["stall", "verdict"] and settings["stall_after"] == 60.0
    args.notify = "true"
    assert judge_settings(args, inv)["notify"] == "true"
    with pytest.raises(InventoryError) as err:
        load_text(tmp_path, "bad.yaml", "notify: 5\nhosts:\n  - {name: n0, addr: 10.0.0.1}\n")
    assert err.value.line == 1 and "notify must be text" in str(err.value)


def test_notify_on_names_only_known_kinds():
    import argparse

    from console.launch.options import judge_settings
    from console.errors import UsageError
    args = argparse.Namespace(stall_after=5.0, on_hang="stop", max_wall=None, notify=None,
                              notify_on="stall,typo")
    with pytest.raises(UsageError) as err:
        judge_settings(args, Inventory(path="", hosts=[]))
    assert "typo" in str(err.value)
