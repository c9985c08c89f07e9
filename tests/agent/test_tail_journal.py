"""The journal and the log follower: byte offsets, partial lines, replaced files."""

import os
import shutil

from agent import tail
from agent.journal import JournalReader, JournalWriter
from agent.tail import LogFollower


def test_journal_reader_returns_whole_records_only(tmp_path):
    path = str(tmp_path / "journal")
    w = JournalWriter(path)
    w.append({"k": "event", "what": "a"})
    w.append({"k": "data", "f": 1, "o": 0}, b"line one\nline two\n")
    r = JournalReader(path)
    recs = r.read()
    assert [m["k"] for m, _d, _e in recs] == ["event", "data"]
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
    assert meta == {"k": "data", "f": 1, "o": 18} and data == b"abcd\n"
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
