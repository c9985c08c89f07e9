"""inotify wake-ups (agent/host/watch.py) for the log follower and serve, and the polling fallback.

Every test that needs a wake sets the fallback intervals (rescans, idle sleeps) far beyond the
test's own bounds, so only inotify can deliver in time: a broken watch fails the test instead
of being covered by a poll. The fallback is forced the way a user would (``RANKDECK_WATCH=poll``)
or the way a host does it (the kernel refusing a watch: the user's limit).
"""

import errno
import os
import shutil
import threading

import pytest

from agent.serve import server as serve, streams as serve_streams
from agent.host import tail, watch
from agent.host.journal import JournalWriter
from agent.host.tail import LogFollower



def make_rank_file(base, inst="run_abc", attempt=0, local_rank=0):
    """A torchrun rank folder with its two files; the stdout file's path."""
    d = os.path.join(base, inst, "attempt_%d" % attempt, str(local_rank))
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "stderr.log"), "ab").close()
    return os.path.join(d, "stdout.log")


def data_of(records):
    return b"".join(d for m, d in records if m["k"] == "data")

WAIT = 20.0  # far more than a wake takes, far less than the fallback intervals set below


@pytest.fixture
def inotify():
    w = watch.open_watch()
    if w is None:
        pytest.skip("no inotify on this host")
    yield w
    w.close()


@pytest.fixture
def no_rescan(monkeypatch):
    """Without events the follower would not look at its folders during the test."""
    monkeypatch.setattr(tail, "RESCAN", 3600.0)


def test_poll_setting_turns_inotify_off(monkeypatch):
    monkeypatch.setenv(watch.ENV, "poll")
    assert watch.open_watch() is None


def test_a_write_wakes_the_watch_and_drain_tells_what_changed(tmp_path, inotify):
    inotify.add(str(tmp_path))
    assert not inotify.wait(0) and inotify.drain() == 0
    with open(tmp_path / "stdout.log", "ab") as f:  # a new entry: a rescan is due
        f.write(b"x\n")
    assert inotify.wait(WAIT)
    assert inotify.drain() & watch.STRUCTURE
    with open(tmp_path / "stdout.log", "ab") as f:  # bytes only: read, no rescan
        f.write(b"y\n")
    assert inotify.wait(WAIT)
    changed = inotify.drain()
    assert changed & watch.IN_MODIFY and not changed & watch.STRUCTURE
    assert not inotify.wait(0)


def test_wake_from_another_thread_ends_a_wait(inotify):
    threading.Timer(0.05, inotify.wake).start()
    assert inotify.wait(WAIT)
    inotify.drain()
    assert not inotify.wait(0)


def test_follower_finds_new_folders_and_lines_by_events(tmp_path, inotify, no_rescan):
    base = str(tmp_path)
    first = make_rank_file(base, local_rank=0)
    f = LogFollower(base, lambda attempt, lr: lr, watch=inotify)
    with open(first, "ab") as out:
        out.write(b"a0\n")
    assert data_of(f.poll()) == b"a0\n"
    assert f.poll() == []  # nothing written: no file is read
    # a rank folder made after the scan: found through the attempt folder's watch
    second = make_rank_file(base, local_rank=1)
    with open(second, "ab") as out:
        out.write(b"b0\n")
    f.wait(0, WAIT)
    recs = f.poll()
    assert [m["local_rank"] for m, _d in recs if m["k"] == "file"] == [1, 1]  # stdout, stderr
    assert data_of(recs) == b"b0\n"
    # a restart's new torchrun start (a new top folder) too
    third = make_rank_file(base, inst="run_def", local_rank=0)
    with open(third, "ab") as out:
        out.write(b"c0\n")
    f.wait(0, WAIT)
    assert data_of(f.poll()) == b"c0\n"
    f.close()


def test_the_first_poll_reads_on_a_host_booted_a_moment_ago(tmp_path, inotify, monkeypatch):
    """time.monotonic() counts from boot: a follower whose "last scan" started at 0 never
    scanned on a host up for less than RESCAN (the fresh-clone suite's machine, up 7
    minutes, with the 3600 s of the fixtures above)."""
    monkeypatch.setattr(tail.time, "monotonic", lambda: 1.0)  # up one second, RESCAN 2 s
    path = make_rank_file(str(tmp_path))
    with open(path, "ab") as out:
        out.write(b"early\n")
    f = LogFollower(str(tmp_path), lambda attempt, lr: 0, watch=inotify)
    assert data_of(f.poll()) == b"early\n"
    f.close()


def test_follower_reads_a_replaced_attempt_to_its_end_then_the_new_one(tmp_path, inotify,
                                                                      no_rescan):
    base = str(tmp_path)
    path = make_rank_file(base)
    f = LogFollower(base, lambda attempt, lr: 0, watch=inotify)
    out = open(path, "ab")
    out.write(b"old 1\n")
    out.flush()
    assert data_of(f.poll()) == b"old 1\n"
    shutil.rmtree(os.path.join(base, "run_abc", "attempt_0"))
    out.write(b"old 2\n")  # the deleted file's last words: no folder reports them
    out.close()
    new = make_rank_file(base)
    with open(new, "ab") as o:
        o.write(b"new 1\n")
    f.wait(0, WAIT)
    got = f.poll()
    f.wait(0, WAIT)
    got += f.poll()
    assert sorted(data_of(got).splitlines()) == [b"new 1", b"old 2"]
    assert not f.closing  # the deleted file, read to its end, is closed
    f.close()


def test_follower_polls_again_when_the_kernel_refuses_a_watch(tmp_path, monkeypatch):
    class Refusing(watch.Watch):  # the user's fs.inotify.max_user_watches reached
        def add(self, path, mask=watch.DIR_EVENTS):
            raise OSError(errno.ENOSPC, "No space left on device")
    try:
        refusing = Refusing()
    except (OSError, AttributeError):
        pytest.skip("no inotify on this host")
    monkeypatch.setattr(tail, "SCAN_EVERY", 0.0)
    base = str(tmp_path)
    path = make_rank_file(base)
    f = LogFollower(base, lambda attempt, lr: 0, watch=refusing)
    with open(path, "ab") as out:
        out.write(b"one\n")
    assert data_of(f.poll()) == b"one\n"
    assert f.watch is None and refusing.fd == -1  # given back: the fallback polls
    later = make_rank_file(base, local_rank=1)
    with open(later, "ab") as out:
        out.write(b"two\n")
    assert data_of(f.poll()) == b"two\n"
    f.close()


class Collect:
    """serve's output: the journal messages' data, and a flag when a wanted line came."""

    def __init__(self, want):
        self.want = want
        self.buf = b""
        self.seen = threading.Event()

    def write(self, data):
        self.buf += data
        if self.want in self.buf:
            self.seen.set()

    def flush(self):
        pass


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_serve_streams_an_append_without_polling_or_by_polling(tmp_path, monkeypatch, mode):
    if mode == "poll":
        monkeypatch.setenv(watch.ENV, "poll")
    else:
        monkeypatch.delenv(watch.ENV, raising=False)
        # without a wake the loop would sleep on
        monkeypatch.setattr(serve_streams, "IDLE", 3600.0)
        monkeypatch.setattr(serve_streams, "STATE_POLL", 0.0)
    ndir = tmp_path / "node1"
    ndir.mkdir()
    journal = JournalWriter(str(ndir / "journal"))
    journal.append({"k": "event", "what": "launched"})
    monkeypatch.setattr(serve.node, "node_dir", lambda args: str(ndir))
    out = Collect(b"the line after")
    server = serve.Server(out=out)
    if mode == "inotify" and server.streams.watch is None:
        pytest.skip("no inotify on this host")
    assert (server.streams.watch is None) == (mode == "poll")
    server.streams.gpu_interval = 0
    asleep = threading.Event()  # the loop sleeps again after sending the first record
    if server.streams.watch is not None:
        real_wait = server.streams.watch.wait

        def wait(timeout):
            if b"launched" in out.buf:
                asleep.set()
            return real_wait(timeout)

        server.streams.watch.wait = wait
    loop = threading.Thread(target=server.streams.stream_loop, daemon=True)
    loop.start()
    try:
        server.op_subscribe({"node": "node1"})
        if mode == "inotify":
            assert asleep.wait(WAIT), out.buf[-500:]
        # the supervisor appends one record: only the watch can wake the loop in time
        journal.append({"k": "data", "f": 1, "o": 0, "ts": 1.0}, b"the line after\n")
        assert out.seen.wait(WAIT), out.buf[-500:]
        assert out.buf.count(b"the line after") == 1
    finally:
        server.closed.set()
        server.streams.turn_now()
        loop.join(WAIT)
        journal.close()


def test_a_child_ending_and_a_signal_end_a_wait(inotify):
    """The supervisor sleeps up to a second: torchrun's end and a stop must not wait it out."""
    import signal
    import subprocess
    import sys

    got = []
    old_usr2 = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        inotify.wake_on_signals(signal.SIGCHLD)
        subprocess.Popen([sys.executable, "-c", "pass"]).wait()
        assert inotify.wait(WAIT)
        inotify.drain()
        assert not inotify.wait(0)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert inotify.wait(WAIT) and got == [signal.SIGUSR2]
    finally:
        inotify.close()  # gives the wakeup fd back
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGUSR2, old_usr2)
    assert signal.set_wakeup_fd(-1) == -1
