"""One helper starts a detached process and waits for its info file (agent/host/detach.py):
the run's judge (agent/judge/control.py) and its rendezvous store (agent/store/tcpstore.py)
both start through it. Real child processes: one that writes its file, one that dies before,
one that never writes; the file it returns is owner-only; an earlier process's is never taken
for the new one's."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys

import pytest

from agent.host import detach

# the child: its stdin (the spec) and its session into the info file, written in one rename
# with a umask that would leave it readable by everyone
WRITES = ("import json, os, sys; os.umask(0o022); spec = sys.stdin.read(); "
          "tmp = sys.argv[1] + '.tmp'; json.dump({'pid': os.getpid(), 'spec': spec, "
          "'sid': os.getsid(0)}, open(tmp, 'w')); os.replace(tmp, sys.argv[1]); "
          "import time; time.sleep(60)")


class Spawns:
    """detach.spawn, with the processes it started kept for the test to look at and end."""

    def __init__(self):
        self.procs = []

    def __call__(self, *args):
        proc = detach.spawn(*args)
        self.procs.append(proc)
        return proc

    def end(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def spawns():
    got = Spawns()
    yield got
    got.end()


def test_the_info_file_is_returned_owner_only_from_a_child_of_its_own_session(tmp_path, spawns):
    path = str(tmp_path / "info.json")
    info, proc = detach.start([sys.executable, "-c", WRITES, path], path, "the child",
                              data=b"the spec", out=str(tmp_path / "child.log"), timeout=60,
                              spawn=spawns)
    assert info["pid"] == proc.pid and info["spec"] == "the spec"
    assert info["sid"] == proc.pid  # detached: a session of its own
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # written 0644, made owner-only
    assert proc.poll() is None


def test_an_earlier_processs_file_is_not_taken_for_the_new_ones(tmp_path, spawns):
    path = str(tmp_path / "info.json")
    with open(path, "w") as f:
        json.dump({"pid": 1, "spec": "old"}, f)
    info, proc = detach.start([sys.executable, "-c", WRITES, path], path, "the child",
                              data=b"new", timeout=60, spawn=spawns)
    assert info["pid"] == proc.pid and info["spec"] == "new"


def test_ready_waits_for_the_file_it_takes(tmp_path, spawns):
    """``ready`` refuses what is not the new process's: the wait goes on, then times out."""
    path = str(tmp_path / "info.json")
    with pytest.raises(RuntimeError, match="did not write info.json within 2 s"):
        detach.start([sys.executable, "-c", WRITES, path], path, "the child", data=b"x",
                     timeout=2, spawn=spawns, ready=lambda info, proc: info["pid"] == -1)
    assert spawns.procs[0].wait(10) == -signal.SIGKILL  # killed, not left behind


def test_a_child_that_dies_before_writing_is_an_error_with_its_log(tmp_path, spawns):
    path = str(tmp_path / "info.json")
    log = str(tmp_path / "child.log")
    with pytest.raises(RuntimeError) as exc:
        detach.start([sys.executable, "-c", "import sys; sys.exit('no such spec: boom')"],
                     path, "the judge", out=log, timeout=60, spawn=spawns)
    words = str(exc.value)
    assert "the judge ended (exit code 1) before it wrote info.json" in words, words
    assert "no such spec: boom" in words, words  # the tail of its log


def test_a_file_that_never_appears_times_out_with_a_clear_error_and_the_child_killed(
        tmp_path, spawns):
    path = str(tmp_path / "info.json")
    log = str(tmp_path / "child.log")
    with pytest.raises(RuntimeError) as exc:
        detach.start([sys.executable, "-c", "print('waiting for torch', flush=True); "
                      "import time; time.sleep(60)"], path, "the rendezvous store", out=log,
                     timeout=3, spawn=spawns)
    words = str(exc.value)
    assert "the rendezvous store did not write info.json within 3 s" in words, words
    assert "waiting for torch" in words, words
    assert spawns.procs[0].wait(10) == -signal.SIGKILL


def test_a_child_that_writes_and_ends_at_once_still_counts(tmp_path, spawns):
    path = str(tmp_path / "info.json")
    writes_and_ends = WRITES.replace("import time; time.sleep(60)", "pass")
    info, proc = detach.start([sys.executable, "-c", writes_and_ends, path], path, "the child",
                              data=b"", timeout=60, spawn=spawns)
    assert info["pid"] == proc.pid


@pytest.mark.skipif(os.getuid() != 0, reason="another user's file needs root to make")
def test_an_info_file_of_another_user_is_refused_unread(tmp_path, spawns):
    path = str(tmp_path / "info.json")
    plants = ("import json, os, sys; json.dump({'pid': 1}, open(sys.argv[1], 'w')); "
              "os.chown(sys.argv[1], 65534, 65534); import time; time.sleep(60)")
    with pytest.raises(RuntimeError, match="belongs to uid 65534, not to this user"):
        detach.start([sys.executable, "-c", plants, path], path, "the judge", timeout=60,
                     spawn=spawns)


def test_a_link_in_place_of_the_info_file_is_not_followed(tmp_path, spawns):
    path = str(tmp_path / "info.json")
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"pid": 1}))
    links = ("import os, sys; os.symlink(sys.argv[2], sys.argv[1]); "
             "import time; time.sleep(60)")
    with pytest.raises(RuntimeError, match="did not write info.json within 2 s"):
        detach.start([sys.executable, "-c", links, path, str(target)], path, "the child",
                     timeout=2, spawn=spawns)
