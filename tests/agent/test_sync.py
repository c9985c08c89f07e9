"""Code to the hosts: console/launch/sync.py's sync_node against agent/sync/place.py, over the wire format.

Every request and answer is encoded and decoded with agent/wire/protocol.py (and must fit in one
message of at most MAX_MESSAGE bytes); the agent side runs on threads, as serve runs requests.
Real files in temporary folders.
"""

import asyncio
import json
import os

import pytest

from agent.wire import protocol
from agent.sync import place as agent_sync
from agent.wire.sync import MAX_MESSAGE, tree_hash
from console.run.link import AgentError
from console.launch.sync import Entry, Manifest, _plan_messages, build_manifest, sync_node


class WireAgent:
    """One node's agent, reached through ``call(op, args)`` as NodeLink.request reaches it."""

    def __init__(self):
        self.transfers = agent_sync.Transfers()
        self.calls = []
        self.largest = 0

    async def __call__(self, op, args):
        line = protocol.encode({"t": "req", "id": len(self.calls) + 1, "op": op, "args": args})
        assert len(line) <= MAX_MESSAGE, "%s request of %d bytes" % (op, len(line))
        self.largest = max(self.largest, len(line))
        self.calls.append(op)
        msg = protocol.decode(line)
        try:
            data = await asyncio.to_thread(agent_sync.request, self.transfers, msg["op"],
                                           msg["args"])
        except agent_sync.SyncError as exc:
            reply = {"t": "res", "id": msg["id"], "ok": False, "kind": exc.kind,
                     "error": str(exc)}
        else:
            reply = {"t": "res", "id": msg["id"], "ok": True, "data": data}
        reply = protocol.decode(protocol.encode(reply))
        if not reply["ok"]:
            raise AgentError(reply["error"], reply["kind"])
        return reply["data"]


def write(root, rel, data=b"x\n", mode=0o644):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return path


def read(root, rel):
    with open(os.path.join(str(root), rel), "rb") as f:
        return f.read()


def host_files(root):
    """Every file under a host workdir outside .rankdeck/, relative."""
    out = []
    for dirpath, dirnames, filenames in os.walk(str(root)):
        dirnames[:] = [d for d in dirnames if d != ".rankdeck"]
        for name in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, name), str(root)))
    return sorted(out)


@pytest.fixture
def laptop(tmp_path):
    root = tmp_path / "laptop"
    write(root, "train.py", b"print('train')\n")
    write(root, "run.sh", b"#!/bin/sh\necho hi\n", mode=0o755)
    write(root, "pkg/model.py", b"class Model: pass\n")
    write(root, "pkg/data/config.yaml", b"lr: 0.1\n")
    write(root, "empty.txt", b"")
    write(root, "big.bin", os.urandom(3 * 1024 * 1024 + 17))  # several put messages
    return root


async def sync(agent, laptop, workdir, progress=None):
    return await sync_node(agent, build_manifest(str(laptop)), str(workdir), progress)


async def test_first_sync_places_everything_then_unchanged_is_one_call(laptop, tmp_path):
    host = tmp_path / "host"
    agent = WireAgent()
    seen = []
    result = await sync(agent, laptop, host, seen.append)

    assert not result.same and result.files_sent == 6
    assert host_files(host) == host_files(laptop)
    for rel in host_files(laptop):
        assert read(host, rel) == read(laptop, rel), rel
    assert os.stat(host / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(host / "train.py").st_mode & 0o777 == 0o644
    assert agent.calls.count("sync_put") >= 4  # big.bin does not fit one message
    assert seen[-1].phase == "done" and seen[-1].bytes_done == seen[-1].bytes_total \
        == os.path.getsize(laptop / "big.bin") + 15 + 18 + 18 + 8
    assert seen[-1].files_done == 6
    assert not os.listdir(host / ".rankdeck" / "sync")  # staging cleaned

    again = WireAgent()
    second = await sync(again, laptop, host)
    assert second.same and again.calls == ["sync_check"]


async def test_one_changed_file_sends_that_file_only(laptop, tmp_path):
    host = tmp_path / "host"
    await sync(WireAgent(), laptop, host)
    write(laptop, "pkg/model.py", b"class Model: changed = True\n")
    agent = WireAgent()
    result = await sync(agent, laptop, host)
    assert result.files_sent == 1 and result.bytes_sent == len(b"class Model: changed = True\n")
    assert agent.calls == ["sync_check", "sync_plan", "sync_put", "sync_commit"]
    assert read(host, "pkg/model.py") == b"class Model: changed = True\n"


async def test_mode_change_and_touched_host_file_send_no_bytes(laptop, tmp_path):
    host = tmp_path / "host"
    await sync(WireAgent(), laptop, host)
    os.chmod(laptop / "train.py", 0o755)
    os.utime(host / "pkg" / "model.py", (1, 1))  # same bytes, other mtime on the host
    agent = WireAgent()
    result = await sync(agent, laptop, host)
    assert result.files_sent == 0 and "sync_put" not in agent.calls
    assert os.stat(host / "train.py").st_mode & 0o777 == 0o755
    assert (await sync(WireAgent(), laptop, host)).same


async def test_removed_locally_is_removed_only_where_rankdeck_placed_it(laptop, tmp_path):
    host = tmp_path / "host"
    write(host, "pkg/data/config.yaml", b"lr: 0.1\n")  # on the host before: same bytes
    write(host, "notes.txt", b"the user's\n")           # the user's own file
    write(laptop, "tools/deep/t.py", b"t\n")             # rankdeck makes tools/ and tools/deep/
    await sync(WireAgent(), laptop, host)
    write(host, "pkg/data/user.txt", b"user file in a placed folder\n")
    with open(host / "run.sh", "ab") as f:
        f.write(b"# edited on the host\n")
    for rel in ("train.py", "run.sh", "pkg/data/config.yaml", "big.bin"):
        os.remove(laptop / rel)
    os.rmdir(laptop / "pkg" / "data")

    result = await sync(WireAgent(), laptop, host)

    assert sorted(result.removed) == ["big.bin", "train.py"]
    assert result.kept == ["run.sh"]  # changed on the host after rankdeck placed it
    assert host_files(host) == ["empty.txt", "notes.txt", "pkg/data/config.yaml",
                                "pkg/data/user.txt", "pkg/model.py", "run.sh",
                                "tools/deep/t.py"]
    # rankdeck did not write config.yaml (the host had it): it stays
    assert read(host, "pkg/data/config.yaml") == b"lr: 0.1\n"
    os.remove(host / "pkg" / "data" / "user.txt")
    os.remove(host / "pkg" / "data" / "config.yaml")
    os.remove(laptop / "pkg" / "model.py")
    os.remove(laptop / "tools" / "deep" / "t.py")
    await sync(WireAgent(), laptop, host)
    # folders rankdeck made go once empty; ones the user made (pkg/data, before) stay
    assert not os.path.exists(host / "tools")
    assert os.path.isdir(host / "pkg" / "data")
    assert host_files(host) == ["empty.txt", "notes.txt", "run.sh"]


async def test_changed_while_sending_fails_the_sha_check_and_places_nothing(laptop, tmp_path):
    host = tmp_path / "host"
    manifest = build_manifest(str(laptop))
    write(laptop, "train.py", b"print('edited after hashing')\n")
    with pytest.raises(AgentError) as err:
        await sync_node(WireAgent(), manifest, str(host))
    assert err.value.kind == "sha" and "train.py" in str(err.value)
    assert host_files(host) == []
    assert not os.path.exists(host / ".rankdeck" / "placed.json")
    assert not os.listdir(host / ".rankdeck" / "sync")
    # a fresh manifest goes through
    assert (await sync(WireAgent(), laptop, host)).files_sent == 6


async def test_wrong_bytes_for_a_file_are_refused(tmp_path):
    host = tmp_path / "host"
    agent = WireAgent()
    entries = [["a.py", 4, 0o644, "0" * 64]]
    plan = await agent("sync_plan", {"session": "ab" * 8, "workdir": str(host),
                                     "tree": tree_hash(entries), "entries": entries})
    assert plan["need"] == [0]
    with pytest.raises(AgentError) as err:
        await agent("sync_put", {"session": "ab" * 8, "pieces": [[0, 0, "YWJjZA=="]]})
    assert err.value.kind == "sha"
    assert host_files(host) == []
    with pytest.raises(AgentError, match="hash to") as err:  # the transfer's own failure
        await agent("sync_commit", {"session": "ab" * 8})
    assert err.value.kind == "sha"


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.py", "a/../../outside.py",
                                  "a//b.py", "./a.py", "", ".rankdeck/placed.json",
                                  "sub/.git/config", "nul\0.py"])
async def test_hostile_paths_are_refused(tmp_path, path):
    host = tmp_path / "host"
    entries = [[path, 1, 0o644, "a" * 64]]
    with pytest.raises(AgentError) as err:
        await WireAgent()("sync_plan", {"session": "cd" * 8, "workdir": str(host),
                                        "tree": tree_hash(entries), "entries": entries})
    assert err.value.kind == "path"
    assert os.listdir(str(tmp_path)) == []  # nothing made, not even the workdir


async def test_symlinked_folder_leading_out_of_the_workdir_is_refused(tmp_path):
    host, outside = tmp_path / "host", tmp_path / "outside"
    os.makedirs(host)
    os.makedirs(outside)
    os.symlink(str(outside), host / "escape")
    os.makedirs(host / "inner")
    os.symlink("inner", host / "alias")  # a link that stays inside is fine
    agent = WireAgent()
    entries = [["escape/evil.py", 1, 0o644, "a" * 64]]
    with pytest.raises(AgentError) as err:
        await agent("sync_plan", {"session": "ef" * 8, "workdir": str(host),
                                  "tree": tree_hash(entries), "entries": entries})
    assert err.value.kind == "path"
    laptop = tmp_path / "laptop"  # (a file link where the tree has a file: test_sync_safety)
    write(laptop, "alias/ok.py", b"ok\n")
    write(laptop, "train.py", b"mine\n")
    await sync(agent, laptop, host)
    assert os.listdir(outside) == []
    assert read(host, "inner/ok.py") == b"ok\n" and read(host, "train.py") == b"mine\n"


async def test_folder_where_the_tree_has_a_file_is_a_conflict(laptop, tmp_path):
    host = tmp_path / "host"
    write(host, "train.py/inside.txt", b"a folder named like the script\n")
    with pytest.raises(AgentError) as err:
        await sync(WireAgent(), laptop, host)
    assert err.value.kind == "conflict"
    assert read(host, "train.py/inside.txt") == b"a folder named like the script\n"
    assert not os.listdir(host / ".rankdeck" / "sync")


async def test_workdir_under_the_login_home(laptop, tmp_path, monkeypatch):
    home = tmp_path / "home"
    os.makedirs(home)
    monkeypatch.setenv("HOME", str(home))
    for workdir, where in (("proj", "proj"), ("~/other", "other")):  # ("~": refused)
        result = await sync(WireAgent(), laptop, workdir)
        assert result.workdir == os.path.join(str(home), where)
        assert read(home / where, "train.py") == b"print('train')\n"


async def test_a_large_manifest_goes_in_several_plan_messages(tmp_path):
    entries = [Entry("d%03d/%s_%05d.py" % (i % 100, "n" * 150, i), 0, 0o644,
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
               for i in range(6000)]
    manifest = Manifest(str(tmp_path / "unused"), entries, "git")
    assert len(json.dumps([e.wire() for e in entries])) > MAX_MESSAGE
    chunks = list(_plan_messages(manifest, {"session": "0" * 16}))
    assert len(chunks) >= 2 and sum(len(c) for c in chunks) == 6000
    agent = WireAgent()
    host = tmp_path / "host"
    for i, chunk in enumerate(chunks):
        reply = await agent("sync_plan", {"session": "12" * 8, "workdir": str(host),
                                          "tree": manifest.tree, "entries": chunk,
                                          "more": i < len(chunks) - 1})
    assert len(reply["need"]) == 6000 and reply["bytes"] == 0
    await agent("sync_abort", {"session": "12" * 8})
    assert not os.listdir(host / ".rankdeck" / "sync")


async def test_a_manifest_cut_short_is_refused(laptop, tmp_path):
    manifest = build_manifest(str(laptop))
    entries = [e.wire() for e in manifest.entries][:-1]
    with pytest.raises(AgentError, match="does not hash to its tree"):
        await WireAgent()("sync_plan", {"session": "34" * 8, "workdir": str(tmp_path / "h"),
                                        "tree": manifest.tree, "entries": entries})
