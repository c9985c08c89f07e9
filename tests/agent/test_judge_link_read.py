"""How a node's judge link reads its journal (agent/supervisor/judge_link.py, agent/host/journal.py
``read_metas``): the metas it forwards are the ones a full read finds, data records are passed
over undecoded, and one turn forwards everything the journal gained, however much."""

from __future__ import annotations

import json

import pytest

from agent.host import journal as journal_mod
from agent.supervisor import judge_link
from agent.host.journal import META_WINDOW, JournalReader, JournalWriter
from agent.wire.protocol import JournalCorrupt

LINE = b"rank=3 seq=123456 t=1764212345.123456 xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n"


def mixed_journal(path, turns=200):
    """A journal as a supervisor writes one: data records between files, metrics, events."""
    writer = JournalWriter(str(path))
    writer.append_many([({"k": "file", "f": 1, "rank": 0, "stream": "stdout"}, b""),
                        ({"k": "file", "f": 2, "rank": 1, "stream": "stdout"}, b"")])
    for i in range(turns):
        writer.append_many([
            ({"k": "data", "f": 1 + i % 2, "o": i * 4096, "ts": 1.0 + i}, LINE * (1 + i % 50)),
            ({"k": "metric", "f": 1 + i % 2, "step": i, "loss": 1.0 / (i + 1), "ts": 1.0 + i},
             b""),
            ({"k": "ckpt_done", "step": i, "path": "/x/step_%d" % i}, b""),
        ])
        if i % 37 == 0:
            writer.append_many([({"k": "event", "ev": "note", "text": "data \"k\":\"data\""},
                                 b"")])
    writer.close()
    return writer.size


def test_read_metas_finds_what_a_full_read_finds_with_the_same_offsets(tmp_path):
    path = tmp_path / "journal"
    mixed_journal(path)
    kinds = judge_link.FORWARD
    full, reader = [], JournalReader(str(path))
    while True:
        recs = reader.read(limit=7000)  # small reads: records cut across reads
        if not recs:
            break
        full += [meta for meta, _data, _end in recs if meta.get("k") in kinds]
    metas, reader = [], JournalReader(str(path))
    while True:
        got = reader.read_metas(kinds, limit=7000)
        if not got and reader.offset == path.stat().st_size:
            break
        metas += got
    assert metas == full
    assert {m["k"] for m in metas} == {"file", "metric", "event", "ckpt_done"}  # no data
    assert all(isinstance(m["j"], int) for m in metas)


def test_a_data_record_is_passed_over_without_decoding_its_meta(tmp_path, monkeypatch):
    path = tmp_path / "journal"
    mixed_journal(path, turns=20)
    decoded = []
    real = journal_mod.decode_meta
    monkeypatch.setattr(journal_mod, "decode_meta",
                        lambda meta, start: decoded.append(meta) or real(meta, start))
    JournalReader(str(path)).read_metas(("metric",))
    assert decoded and not [m for m in decoded if m.startswith(b'{"k":"data"')]
    assert not [m for m in decoded if m.startswith(b'{"k":"ckpt_done"')]


@pytest.mark.parametrize("meta", [
    {"f": 1, "k": "metric", "step": 3},  # its kind not first: decoded
    {"k": "metr\\u0069c", "step": 3},  # an escape in its kind: decoded, and a metric
    {"k": "metr\\ic", "step": 3},  # an escape in its kind: decoded, and not a metric
    {"k": "metric", "path": "p" * (3 * META_WINDOW)},  # longer than a window: read whole
])
def test_a_meta_that_does_not_begin_with_its_kind_is_decoded(tmp_path, meta):
    path = tmp_path / "journal"
    body = json.dumps(meta, separators=(",", ":")).replace("\\\\u0069", "\\u0069").encode()
    path.write_bytes(b"%d 0\n%s" % (len(body), body))
    got = JournalReader(str(path)).read_metas(("metric",))
    decoded = json.loads(body)
    assert got == ([dict(decoded, j=0)] if decoded.get("k") == "metric" else [])


def test_read_metas_stops_at_damage_as_read_does(tmp_path):
    path = tmp_path / "journal"
    mixed_journal(path, turns=5)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"no record here\n" * 10)
    reader = JournalReader(str(path))
    metas = reader.read_metas(judge_link.FORWARD)
    assert metas and reader.offset == size
    with pytest.raises(JournalCorrupt):
        reader.read_metas(judge_link.FORWARD)


class Line:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def test_one_turn_forwards_all_the_journal_gained_however_much(tmp_path):
    """Eight MiB of log data since the last turn: every metric goes to the judge in this
    turn. One read a turn (a MiB) fed a node of more than 2 MiB/s to the judge ever later."""
    ndir = tmp_path / "node0"
    ndir.mkdir()
    JournalWriter(str(ndir / "journal")).close()
    link = judge_link.JudgeLink({}, "node0", str(ndir), dict, dict, lambda _t: None)
    writer = JournalWriter(str(ndir / "journal"))
    chunk = LINE * 800  # ~66 KB
    for i in range(140):
        writer.append_many([({"k": "data", "f": 1, "o": i * len(chunk)}, chunk),
                            ({"k": "metric", "f": 1, "step": i}, b"")])
    writer.close()
    assert (ndir / "journal").stat().st_size > 8 << 20
    line = Line()
    link._send_records(line)
    steps = [m["step"] for msg in line.sent for m in msg["recs"]]
    assert steps == list(range(140))
    link._send_records(line)  # nothing new: nothing sent
    assert [m["step"] for msg in line.sent for m in msg["recs"]] == steps
