"""`sync:` in an inventory's defaults: the folder `rankdeck launch` sends to every host."""

import os

import pytest

from inventory.loader import load_inventory
from inventory.model import InventoryError

HOSTS = "hosts:\n  - name: node0\n    ssh: gpu0\n"


def test_relative_sync_is_read_against_the_inventory_folder(tmp_path, monkeypatch):
    folder = tmp_path / "cluster"
    folder.mkdir()
    inv = folder / "hosts.yaml"
    inv.write_text("defaults:\n  sync: ../proj\n" + HOSTS)
    monkeypatch.chdir("/")  # where rankdeck was started from does not matter
    assert load_inventory(str(inv)).sync == str(tmp_path / "proj")


def test_sync_dot_home_and_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    inv = tmp_path / "hosts.yaml"
    for written, expected in ((".", str(tmp_path)), ("~/proj", str(tmp_path / "home/proj")),
                              ("/srv/code/", "/srv/code")):
        inv.write_text("defaults:\n  sync: %s\n" % written + HOSTS)
        assert load_inventory(str(inv)).sync == expected, written


def test_toml_sync(tmp_path):
    inv = tmp_path / "hosts.toml"
    inv.write_text('[defaults]\nsync = "src"\n\n[[hosts]]\nname = "node0"\nssh = "gpu0"\n')
    assert load_inventory(str(inv)).sync == str(tmp_path / "src")


def test_no_sync_is_none(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS)
    assert load_inventory(str(inv)).sync is None


@pytest.mark.parametrize("text, message", [
    ("defaults:\n  sync: 3\n" + HOSTS, "hosts.yaml:2: defaults: sync must be text, got 3"),
    ("defaults:\n  sync: ''\n" + HOSTS, "hosts.yaml:2: defaults: sync is empty"),
    (HOSTS + "    sync: .\n",
     "hosts.yaml:4: host 'node0': sync is one folder for every host; move 'sync:' under "
     "defaults"),
])
def test_sync_mistakes_name_the_line(tmp_path, text, message):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(text)
    with pytest.raises(InventoryError) as err:
        load_inventory(str(inv))
    assert str(err.value).startswith(os.path.join(str(tmp_path), message)), str(err.value)
