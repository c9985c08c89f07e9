"""What `--sync DIR` leaves out unless named: files that look like secrets (issue 29).

``.env``/``.env.*``, SSH key files (``id_`` and a name without a dot: ``id_rsa``,
``id_ed25519``), ``*.pem``, ``*.key`` and ``.netrc`` (issue 40) are not sent even when git
lists them, each named in a warning; ``--sync-include PATTERN`` (a .gitignore-style pattern,
repeatable) sends those it matches, with their owner-only mode kept.
"""

import asyncio
import os

from console.verbs import cli, launch as launch_verbs
from console.launch.sync import build_manifest
from tests.unit.test_sync_manifest import git, paths, write
from tests.unit.test_sync_manifest import plain_git  # noqa: F401 - autouse: no global git config

SECRETS = [".env", "config/.env.production", "id_rsa", "keys/id_ed25519", "certs/server.pem",
           "certs/server.key", ".netrc"]
CODE = ["train.py", "id_map.json", "environment.yml", "pkg/.envrc_not_env.py", "keys.py",
        "pkg/hotkey.json", "netrc.md"]


def tree(root):
    for rel in SECRETS:
        write(root, rel, "secret\n", mode=0o600)
    for rel in CODE:
        write(root, rel, "code\n")


def test_secret_looking_files_are_left_out_with_a_warning(tmp_path):
    root = tmp_path / "proj"
    tree(root)
    m = build_manifest(str(root))
    assert paths(m) == sorted(CODE)
    left = {path: why for path, why in m.skipped}
    assert sorted(left) == sorted(SECRETS)
    assert all("--sync-include" in why for why in left.values())


def test_secret_looking_files_are_left_out_even_when_git_tracks_them(tmp_path):
    root = tmp_path / "proj"
    tree(root)
    git(root, "init", "-q")
    git(root, "add", ".")
    m = build_manifest(str(root))
    assert m.source == "git" and paths(m) == sorted(CODE)
    assert sorted(p for p, _ in m.skipped) == sorted(SECRETS)


def test_sync_include_sends_what_it_names_with_its_owner_only_mode(tmp_path):
    root = tmp_path / "proj"
    tree(root)
    m = build_manifest(str(root), include=[".env", "certs/*.pem"])
    assert paths(m) == sorted(CODE + [".env", "certs/server.pem"])
    modes = {e.path: e.mode for e in m.entries}
    assert modes[".env"] == 0o600 and modes["certs/server.pem"] == 0o600
    assert modes["train.py"] == 0o644
    assert sorted(p for p, _ in m.skipped) == [".netrc", "certs/server.key",
                                              "config/.env.production", "id_rsa",
                                              "keys/id_ed25519"]


def test_owner_only_modes_change_the_tree(tmp_path):
    root = tmp_path / "proj"
    write(root, "train.py", "x\n", mode=0o644)
    before = build_manifest(str(root), cache=False).tree
    os.chmod(root / "train.py", 0o600)
    assert build_manifest(str(root), cache=False).tree != before


def test_launch_takes_repeated_sync_include(tmp_path, monkeypatch):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("transport: local\ndefaults:\n  workdir: %s\nhosts:\n"
                   "  - {name: node0, addr: 127.0.0.2}\n" % (tmp_path / "work"))
    (tmp_path / "code").mkdir()
    seen = []

    async def start_run(inv, spec, args, path):
        seen.append(spec)
        return 0

    monkeypatch.setattr(launch_verbs, "start_run", start_run)
    args = cli.build_parser().parse_args(
        ["launch", "-i", str(inv), "--sync", str(tmp_path / "code"), "--sync-include", ".env",
         "--sync-include", "*.pem", "t.py"])
    assert asyncio.run(launch_verbs.cmd_launch(args)) == 0
    assert seen[0].sync_include == [".env", "*.pem"]
    args = cli.build_parser().parse_args(["launch", "-i", str(inv), "t.py"])
    asyncio.run(launch_verbs.cmd_launch(args))
    assert seen[1].sync_include == []
