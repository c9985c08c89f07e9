"""The journal and the log follower: byte offsets, partial lines, replaced files."""

import os
import shutil

import pytest

from agent.host import tail
from agent.host.journal import JournalReader, JournalWriter, parse
from agent.rules.mask import Masker
from agent.host.tail import LogFollower


def test_journal_reader_returns_whole_records_only(tmp_path):
    path = str(tmp_path / "journal")
    w = JournalWriter(path)
    w.append({"k": "event", "what": "a"})
    w.append({"k": "data", "f": 1, "o": 0}, b"line one\nline two\n")
    r = JournalReader(path)
    recs = r.read()
    assert [m["k"] for m, _d, _e in recs] == ["event", "data"]
    assert [m["j"] for m, _d, _e in recs] == [0, recs[0][2]]  # where each record starts
    assert recs[1][1] == b"line one\nline two\n"
    assert recs[-1][2] == os.path.getsize(path) == r.offset
    # a record whose body is not written yet is not returned, then arrives whole
    body = b'{"k":"data","f":1,"o":18}'
    record = b"%d 5\n" % len(body) + body + b"abcd\n"
    with open(path, "ab") as f:
        f.write(record[:20])
    assert r.read() == []
    with open(path, "ab") as f:
        f.write(record[20:])
    (meta, data, end), = r.read()
    assert meta == {"k": "data", "f": 1, "o": 18, "j": recs[-1][2]} and data == b"abcd\n"
    # a second reader from an offset sees only what follows it
    r2 = JournalReader(path, recs[0][2])
    assert [m["k"] for m, _d, _e in r2.read()] == ["data", "data"]


def make_rank_file(base, inst="run_abc", attempt=0, local_rank=0, stream="stdout"):
    d = os.path.join(base, inst, "attempt_%d" % attempt, str(local_rank))
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, stream + ".log")


def data_of(records, fid=None):
    return b"".join(d for m, d in records if m["k"] == "data" and (fid is None or m["f"] == fid))


def test_follower_tags_rank_and_keeps_partial_lines(tmp_path):
    path = make_rank_file(str(tmp_path))
    f = LogFollower(str(tmp_path), lambda attempt, lr: 5)
    with open(path, "ab") as out:
        out.write(b"first\nsecond without end")
    recs = f.poll(final=False)
    files = [m for m, _d in recs if m["k"] == "file"]
    assert files and files[0]["rank"] == 5 and files[0]["local_rank"] == 0
    assert data_of(recs) == b"first\n"
    with open(path, "ab") as out:
        out.write(b" ... done\n")
    recs = f.poll()
    (meta, data), = [(m, d) for m, d in recs if m["k"] == "data"]
    assert meta["o"] == 6 and data == b"second without end ... done\n"


def test_follower_waits_for_the_rank_then_gives_up(tmp_path, monkeypatch):
    path = make_rank_file(str(tmp_path))
    with open(path, "wb") as out:
        out.write(b"hello\n")
    f = LogFollower(str(tmp_path), lambda attempt, lr: None)
    assert f.poll() == []  # rank unknown: data stays in the file for now
    monkeypatch.setattr(tail, "RANK_WAIT", 0.0)
    recs = f.poll()
    assert [m["k"] for m, _d in recs] == ["file", "data"] and recs[0][0]["rank"] is None


def test_replaced_attempt_folder_is_read_to_the_end_and_followed_anew(tmp_path):
    base = str(tmp_path)
    path = make_rank_file(base)
    f = LogFollower(base, lambda attempt, lr: 0)
    with open(path, "wb") as out:
        out.write(b"old 1\n")
    recs = f.poll(final=True)
    old_fid = [m for m, _d in recs if m["k"] == "file"][0]["f"]
    # torchrun writes a last line, then deletes the attempt folder and makes it again
    with open(path, "ab") as out:
        out.write(b"old 2\n")
    shutil.rmtree(os.path.join(base, "run_abc", "attempt_0"))
    path = make_rank_file(base)
    with open(path, "wb") as out:
        out.write(b"new 1\n")
    recs = f.poll(final=True) + f.poll(final=True)
    new_fid = [m for m, _d in recs if m["k"] == "file"][0]["f"]
    assert new_fid != old_fid
    assert data_of(recs, old_fid) == b"old 2\n"
    assert data_of(recs, new_fid) == b"new 1\n"


def test_torchrun_starts_of_an_earlier_supervisor_are_not_followed_again(tmp_path):
    base = str(tmp_path)
    with open(make_rank_file(base, inst="run_old"), "wb") as out:
        out.write(b"journaled by the node's earlier supervisor\n")
    f = LogFollower(base, lambda attempt, lr: 0, ignore=os.listdir(base))
    with open(make_rank_file(base, inst="run_new"), "wb") as out:
        out.write(b"new\n")
    recs = f.poll(final=True)
    assert [m["instance"] for m, _d in recs if m["k"] == "file"] == ["run_new"]
    assert data_of(recs) == b"new\n"


def test_a_line_without_end_is_passed_on_in_bounded_pieces(tmp_path):
    path = make_rank_file(str(tmp_path))
    f = LogFollower(str(tmp_path), lambda attempt, lr: 0)
    blob = b"x" * (5 * tail.MAX_PENDING)
    with open(path, "wb") as out:
        out.write(blob)
    recs = f.poll()
    pieces = [d for m, d in recs if m["k"] == "data"]
    assert b"".join(pieces) == blob  # nothing held back beyond the cap, nothing lost
    with open(path, "ab") as out:
        out.write(b"y\n")
    assert data_of(f.poll()) == b"y\n"


def test_read_back_pages_through_a_journal_exactly_once(tmp_path, monkeypatch):
    """Paging backwards with read_back returns every record of the asked files once, in order,
    across index windows, a writer reopened mid-way and a record straddling ``before``."""
    import random

    from agent.host import journal
    from agent.host.journal import read_back, read_index

    monkeypatch.setattr(journal, "INDEX_EVERY", 4096)
    path = str(tmp_path / "journal")
    rnd = random.Random(7)
    w = JournalWriter(path)
    for i in range(3000):
        if i == 1500:  # a restarted supervisor appends to the same journal and index
            w.close()
            w = JournalWriter(path)
        fid = rnd.choice((1, 2, 3))
        w.append({"k": "data", "f": fid, "o": i}, b"rec %d of file %d\n" % (i, fid) * rnd.randint(1, 9))
        if i % 7 == 0:
            w.append({"k": "metric", "f": fid, "step": i})
    w.close()
    marks = read_index(path, 1 << 40)
    assert len(marks) > 10 and marks == sorted(marks)
    everything = JournalReader(path).read(1 << 30)
    forward = [(m, d) for m, d, _e in everything]
    starts = {0} | {e for _m, _d, e in everything}  # a record starts where one ends
    assert all(m["j"] in starts for m, _d in forward)
    assert set(marks) <= starts
    want = [(m["j"], d) for m, d in forward if m["k"] == "data" and m["f"] in (1, 3)]
    # start from inside the last record of file 1 or 3: that record is included
    before = want[-1][0] + 1
    got, pages = [], 0
    while before > 0:
        recs, before = read_back(path, before, [1, 3], want=2000)
        assert all(m["f"] in (1, 3) for m, _d, _e in recs)
        got[:0] = [(m["j"], d) for m, d, _e in recs]
        pages += 1
    assert got == want and pages > 5
    size = os.path.getsize(path)
    assert read_back(path, before=size, fids=[99], want=1) == ([], 0)  # no such file


def test_serve_passes_metas_on_as_they_are_the_same_bytes_as_parsed(tmp_path):
    """serve builds its journal messages from the metas' bytes (protocol.journal_line); the
    line must be the one encoding the parsed records would give, for every kind of record."""
    from agent.wire import protocol
    from agent.host.journal import split
    from agent.serve.streams import wire

    w = JournalWriter(str(tmp_path / "journal"))
    w.append({"k": "file", "f": 1, "rank": 3, "path": "/x/\u00e9t\u00e9 \"q\"\\\n", "o": None})
    w.append({"k": "data", "f": 1, "o": 0}, b"ok\n\xff\xfe bad utf-8 \x1b[31m red \x00\r\n")
    w.append({"k": "metric", "f": 1, "step": 7, "loss": 0.1 + 0.2, "lr": 1e-05,
              "big": 2 ** 70, "neg": -3.5e-300, "nested": {"a": [1, 2.5, None, True]}})
    w.append({"k": "event", "what": "x", "text": "\u2603 \ud83d\ude00 tab\tend"})
    w.append({"k": "data", "f": 1, "o": 40}, "caf\u00e9 \u4e2d\n".encode())
    w.close()
    with open(tmp_path / "journal", "rb") as f:
        buf = f.read()
    raw, used = split(buf, 1000)
    parsed, used2 = parse(buf, 1000)
    assert used == used2 == len(buf) and len(raw) == len(parsed) == 5
    for sub in ("node1", 7):
        line = protocol.journal_line(sub, raw[-1][3], raw)
        assert line == protocol.encode({"t": "journal", "sub": sub, "end": parsed[-1][2],
                                        "recs": wire(parsed)})
        assert protocol.decode(line)["recs"][1][0]["j"] == raw[1][2]
    # a meta not as the supervisor writes them is refused (serve then parses, as before)
    with pytest.raises(ValueError):
        protocol.journal_line("n", 1, [(b'{"k":"data"}\n{"x":1}', b"", 0, 1)])
    with pytest.raises(ValueError):
        protocol.journal_line("n", 1, [("{\"k\":\"\u00e9\"}".encode(), b"", 0, 1)])


def test_a_progress_bar_written_with_cr_only_is_cut_at_cr_never_inside_a_secret(tmp_path):
    # tqdm redraws with \r and may write no \n for a whole run: a record that ended at its
    # 64 KiB limit could fall inside a secret, which the host masks within one record only
    secret = b"S3cr3t-Value-Zq9!"
    path = make_rank_file(str(tmp_path))
    masker = Masker([secret.decode()])
    f = LogFollower(str(tmp_path), lambda attempt, lr: 0, keep_whole=masker.safe_cut)
    bar = b"".join(b"\r%6d/100000 key=%s |" % (i, secret) + b"#" * (i % 50)
                   for i in range(6000))
    with open(path, "wb") as out:
        out.write(bar)
    pieces = [d for m, d in f.poll() if m["k"] == "data"]
    # the last bar drawn is passed on too: it is what the trainer shows now
    assert len(pieces) > 3 and b"".join(pieces) == bar
    assert all(p.endswith(b"\r") for p in pieces[:-1])  # every other record ends at a redraw
    assert all(secret not in masker.mask(p) for p in pieces)


def test_a_line_without_any_end_is_never_cut_inside_a_secret(tmp_path):
    secret = b"S3cr3t-Value-Zq9!"
    path = make_rank_file(str(tmp_path))
    masker = Masker([secret.decode()])
    f = LogFollower(str(tmp_path), lambda attempt, lr: 0, keep_whole=masker.safe_cut)
    # a secret across the first record's end, and one at the end of what is there yet
    blob = b"x" * (tail.MAX_RECORD - 5) + secret + b"y" * (tail.MAX_PENDING + 100) + secret[:9]
    with open(path, "wb") as out:
        out.write(blob)
    pieces = [d for m, d in f.poll() if m["k"] == "data"]
    with open(path, "ab") as out:
        out.write(secret[9:] + b" end\n")
    pieces += [d for m, d in f.poll() if m["k"] == "data"]
    assert b"".join(pieces) == blob + secret[9:] + b" end\n"
    masked = [masker.mask(p) for p in pieces]
    assert not any(secret[:6] in p or secret[-6:] in p for p in masked), masked
    assert b"".join(masked).count(b"****") == 2


def test_a_known_rank_waits_for_its_worker_to_exec_and_is_announced_with_its_pid(tmp_path):
    """torchrun opens a worker's files before the worker has exec'd with its environment: the
    file is announced once the worker shows itself, with its pid (the GPU panel's match), not
    at once without it (a restarted rank kept its dead worker's pid)."""
    import subprocess
    import sys
    import time

    from agent.host import procs

    path = make_rank_file(str(tmp_path), local_rank=3)
    with open(path, "ab") as out:
        out.write(b"step 1\n")
    # the worker as torchrun makes it: a child first, its environment only once it exec'd
    worker = subprocess.Popen(["sh", "-c", 'sleep 0.4; exec env LOCAL_RANK=3 RANK=7 '
                               'TORCHELASTIC_RESTART_COUNT=0 "$0" -c "import time; '
                               'time.sleep(30)"', sys.executable])
    try:
        def resolve(attempt, local_rank):
            live = procs.worker_rank(os.getpid(), attempt, local_rank)
            return 7, {"world_size": 8, "pid": live[2] if live else None}

        f = LogFollower(str(tmp_path), resolve)
        assert f.poll(final=False) == []  # the rank is known, its worker not yet: data waits
        deadline = time.monotonic() + 10
        files = []
        while not files and time.monotonic() < deadline:
            time.sleep(0.05)
            recs = f.poll(final=False)
            files = [m for m, _d in recs if m["k"] == "file"]
        assert files and files[0]["rank"] == 7 and files[0]["pid"] == worker.pid, files
        assert data_of(recs) == b"step 1\n"
    finally:
        worker.kill()
        worker.wait()


def test_a_worker_that_never_shows_is_announced_without_a_pid(tmp_path, monkeypatch):
    monkeypatch.setattr(tail, "PID_WAIT", 0.2)
    path = make_rank_file(str(tmp_path))
    with open(path, "ab") as out:
        out.write(b"gone already\n")
    f = LogFollower(str(tmp_path), lambda attempt, lr: (2, {"world_size": 4, "pid": None}))
    assert f.poll(final=False) == []
    import time
    time.sleep(0.25)
    (meta,) = [m for m, _d in f.poll(final=False) if m["k"] == "file"]
    assert meta["rank"] == 2 and "pid" not in meta
