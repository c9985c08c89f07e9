"""Code to the hosts, what ``--sync`` must never do to the host (issue 29, "Code sync").

Real files, the real agent side (agent/sync/place.py) behind the wire format, as in test_sync.py:
owner-only modes stay owner-only; a host file rankdeck never placed is never overwritten; the
login home is never a sync target; two syncs into one workdir cannot mix their trees; the
commit never follows a symlink swapped in after its checks; a long upload's staging folder is
never swept by another console's sync.
"""

import hashlib
import os

import pytest

from agent.sync import place as agent_sync
from console.run.link import AgentError
from console.launch.sync import build_manifest, sync_node
from tests.agent.test_sync import WireAgent, read, sync, write


def mode_of(path):
    return os.lstat(str(path)).st_mode & 0o777


async def test_owner_only_modes_stay_owner_only(tmp_path):
    laptop, host = tmp_path / "laptop", tmp_path / "host"
    write(laptop, "train.py", b"print('hi')\n")
    write(laptop, "creds.cfg", b"token = 1\n", mode=0o600)
    write(laptop, "launch.sh", b"#!/bin/sh\n", mode=0o700)
    write(laptop, "run.sh", b"#!/bin/sh\n", mode=0o755)
    os.makedirs(host)
    os.chmod(host, 0o755)  # a workdir every host user can list
    await sync(WireAgent(), laptop, host)
    assert mode_of(host / "creds.cfg") == 0o600
    assert mode_of(host / "launch.sh") == 0o700
    assert mode_of(host / "run.sh") == 0o755 and mode_of(host / "train.py") == 0o644
    os.chmod(laptop / "train.py", 0o600)  # a mode-only change reaches the host too
    await sync(WireAgent(), laptop, host)
    assert mode_of(host / "train.py") == 0o600
    assert (await sync(WireAgent(), laptop, host)).same


async def test_host_file_rankdeck_never_placed_is_a_conflict_not_overwritten(tmp_path):
    laptop, host = tmp_path / "laptop", tmp_path / "host"
    write(laptop, "train.py", b"print('laptop')\n")
    write(laptop, "notes.txt", b"laptop notes\n")
    write(laptop, "same.txt", b"same\n")
    write(host, "train.py", b"print('the host user wrote this')\n")
    write(host, "notes.txt", b"host notes\n")
    write(host, "same.txt", b"same\n")  # the same bytes: taken as it is, no conflict
    with pytest.raises(AgentError) as err:
        await sync(WireAgent(), laptop, host)
    assert err.value.kind == "conflict"
    assert "notes.txt" in str(err.value) and "train.py" in str(err.value)
    assert "same.txt" not in str(err.value)
    assert read(host, "train.py") == b"print('the host user wrote this')\n"
    assert read(host, "notes.txt") == b"host notes\n"
    assert not os.path.exists(host / ".rankdeck" / "placed.json")
    assert not os.listdir(host / ".rankdeck" / "sync")

    # once the user moved them aside, the sync goes through; the file the host had with
    # the tree's bytes is recorded but never marked as placed, so a later sync without it
    # leaves it there
    os.remove(host / "train.py")
    os.remove(host / "notes.txt")
    await sync(WireAgent(), laptop, host)
    assert read(host, "train.py") == b"print('laptop')\n"
    os.remove(laptop / "same.txt")
    result = await sync(WireAgent(), laptop, host)
    assert "same.txt" not in result.removed and read(host, "same.txt") == b"same\n"


async def test_symlink_on_the_host_where_the_tree_has_a_file_is_a_conflict(tmp_path):
    laptop, host, outside = tmp_path / "laptop", tmp_path / "host", tmp_path / "outside"
    write(laptop, "train.py", b"mine\n")
    write(outside, "target.py", b"outside\n", mode=0o600)
    os.makedirs(host)
    os.symlink(str(outside / "target.py"), host / "train.py")
    with pytest.raises(AgentError) as err:
        await sync(WireAgent(), laptop, host)
    assert err.value.kind == "conflict" and "train.py" in str(err.value)
    assert os.path.islink(host / "train.py")
    assert read(outside, "target.py") == b"outside\n" and mode_of(outside / "target.py") == 0o600


async def test_sync_into_the_login_home_itself_is_refused(tmp_path, monkeypatch):
    laptop, home = tmp_path / "laptop", tmp_path / "home"
    write(laptop, "train.py", b"x\n")
    os.makedirs(home)
    monkeypatch.setenv("HOME", str(home))
    for workdir in ("~", str(home), str(home) + "/", "~/."):
        with pytest.raises(AgentError) as err:
            await sync(WireAgent(), laptop, workdir)
        assert err.value.kind == "path" and "home" in str(err.value), workdir
    assert os.listdir(home) == []  # not even .rankdeck/
    assert (await sync(WireAgent(), laptop, "~/proj")).workdir == str(home / "proj")


class RacingAgent(WireAgent):
    """An agent that runs ``before_commit`` (another console's whole sync) just before it
    takes this transfer's commit, as two launches into one workdir can interleave."""

    def __init__(self, before_commit):
        super().__init__()
        self.before_commit = before_commit

    async def __call__(self, op, args):
        if op == "sync_commit" and self.before_commit is not None:
            hook, self.before_commit = self.before_commit, None
            await hook()
        return await super().__call__(op, args)


@pytest.mark.parametrize("changed", ["unchanged.py", "needed.py"])
async def test_two_syncs_into_one_workdir_the_later_commit_looks_again(tmp_path, changed):
    host = tmp_path / "host"
    first, second = tmp_path / "first", tmp_path / "second"
    write(first, "unchanged.py", b"v0\n")
    await sync(WireAgent(), first, host)
    write(first, "needed.py", b"first's\n")
    write(second, "unchanged.py", b"v0\n")
    write(second, "needed.py", b"first's\n")
    write(second, changed, b"second's tree\n")

    async def other_launch():
        await sync(WireAgent(), second, host)

    with pytest.raises(AgentError) as err:
        await sync(RacingAgent(other_launch), first, host)
    assert err.value.kind == "conflict" and changed in str(err.value)
    # the host keeps the second launch's tree, whole, and its record says so
    assert read(host, changed) == b"second's tree\n"
    assert (await sync_node(WireAgent(), build_manifest(str(second)), str(host))).same
    assert not os.listdir(host / ".rankdeck" / "sync")


async def test_mode_change_never_follows_a_symlink_swapped_in_after_the_plan(tmp_path):
    laptop, host, ssh = tmp_path / "laptop", tmp_path / "host", tmp_path / "ssh"
    write(laptop, "conf.txt", b"conf\n")
    await sync(WireAgent(), laptop, host)
    write(ssh, "id_rsa", b"PRIVATE KEY\n", mode=0o600)
    os.chmod(laptop / "conf.txt", 0o755)

    async def swap():
        os.remove(host / "conf.txt")
        os.symlink(str(ssh / "id_rsa"), host / "conf.txt")

    with pytest.raises(AgentError) as err:
        await sync(RacingAgent(swap), laptop, host)
    assert err.value.kind == "conflict"
    assert mode_of(ssh / "id_rsa") == 0o600 and read(ssh, "id_rsa") == b"PRIVATE KEY\n"


async def test_rename_never_follows_a_folder_swapped_for_a_symlink_after_the_checks(
        tmp_path, monkeypatch):
    laptop, host, ssh = tmp_path / "laptop", tmp_path / "host", tmp_path / "ssh"
    write(laptop, "conf/key.txt", b"placed by the sync\n")
    write(ssh, "key.txt", b"PRIVATE KEY\n", mode=0o600)
    os.makedirs(host / "conf")
    real_replace, real_rename = os.replace, os.rename
    swapped = []

    def swap_first(*args, **kwargs):
        # the moment between the commit's checks and its rename: conf/ becomes a link out
        placing = "dst_dir_fd" in kwargs or ".rankdeck/sync/" in str(args[0])
        if placing and not swapped:
            real_rename(str(host / "conf"), str(host / "conf.moved"))
            os.symlink(str(ssh), str(host / "conf"))
            swapped.append(True)
        return real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "replace", swap_first)
    monkeypatch.setattr(os, "rename", swap_first)
    try:
        await sync(WireAgent(), laptop, host)
    except AgentError:
        pass  # refusing is fine too; writing through the link is not
    finally:
        monkeypatch.undo()
    assert swapped
    assert read(ssh, "key.txt") == b"PRIVATE KEY\n" and mode_of(ssh / "key.txt") == 0o600
    assert os.listdir(ssh) == ["key.txt"]


async def test_a_long_upload_keeps_its_staging_from_another_consoles_sweep(tmp_path):
    host = tmp_path / "host"
    data = b"ab"
    entries = [["big.bin", len(data), 0o644, hashlib.sha256(data).hexdigest()]]
    first = WireAgent()
    session = "aa" * 8
    await first("sync_plan", {"session": session, "workdir": str(host),
                              "tree": agent_sync.tree_hash(entries), "entries": entries})
    await first("sync_put", {"session": session, "pieces": [[0, 0, "YQ=="]]})  # b"a"
    staging = host / ".rankdeck" / "sync" / session
    old = os.stat(staging).st_mtime - 10 * agent_sync.STALE_STAGING
    os.utime(staging, (old, old))  # an upload of one big file writes no new names for long
    other = tmp_path / "other"
    write(other, "x.py", b"x\n")
    await sync(WireAgent(), other, tmp_path / "host")  # another console: its plan sweeps
    await first("sync_put", {"session": session, "pieces": [[0, 1, "Yg=="]]})  # b"b"
    await first("sync_commit", {"session": session})
    assert read(host, "big.bin") == b"ab"
