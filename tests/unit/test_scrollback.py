"""Scrolling back: what memory keeps plus pages read back from real journals is every line once.

Journals are written with the agent's own JournalWriter and read back with its read_back (the
code behind the ``scrollback`` op); RunState is fed the records the way a subscription feeds
it. A view's start (kept_lines) plus every page Scrollback fetches must give each line of the
source exactly once, in order, however small the memory and the pages.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from agent.host import journal as journal_mod
from agent.host.journal import JournalReader, JournalWriter, read_back
from agent.wire.protocol import bytes_to_text
from console.model.scrollback import (Scrollback, entries_of, kept_chunks, kept_lines, newest_positions,
                                split_newest)
from console.model.sources import ALL, NODE, RANK
from console.model.state import RunState

T0 = 1_700_000_000.0


class Host:
    """One node's journal: ranks' stdout/stderr and torchrun's own output, interleaved."""

    def __init__(self, path, name, ranks, rnd, tick, partial=False, streams=("stdout", "stderr")):
        self.path, self.name = str(path), name
        self.writer = JournalWriter(self.path)
        self.files = {}  # fid -> rank (-1: torchrun)
        self.text = {}  # fid -> everything written to it
        fid = 1
        for rank in ranks:
            for stream in streams:
                self._file(fid, rank, stream)
                fid += 1
        self._file(fid, None, "torchrun")
        self.rnd, self.tick, self.partial = rnd, tick, partial
        self.n = 0

    def _file(self, fid, rank, stream):
        self.files[fid] = -1 if rank is None else rank
        self.text[fid] = ""
        self.writer.append({"k": "file", "f": fid, "rank": rank, "local_rank": rank,
                            "stream": stream, "attempt": 0, "instance": "i", "path": "p"})

    def write(self, records: int, ts):
        for _ in range(records):
            fid = self.rnd.choice(list(self.files))
            lines = ["%s f%d line %d %s" % (self.name, fid, self.n + i, "x" * self.rnd.randint(0, 40))
                     for i in range(self.rnd.randint(1, 6))]
            self.n += len(lines)
            text = "".join(line + "\n" for line in lines)
            if self.partial and self.rnd.random() < 0.3:  # a line that ends in a later record
                text += "begun %d..." % self.n
            data = text.encode()
            self.writer.append({"k": "data", "f": fid, "o": len(self.text[fid]), "ts": next(ts)},
                               data)
            self.text[fid] += text
            if self.rnd.random() < 0.1:
                self.writer.append({"k": "metric", "f": fid, "step": self.n, "ts": T0})

    def feed(self, state, reader):
        records = reader.read(1 << 30)
        wire = [[m, bytes_to_text(d)] if d else [m] for m, d, _e in records]
        if records:
            state.apply_records(self.name, wire, records[-1][2])

    async def fetch(self, node, fids, before, since, page):
        assert node == self.name
        recs, start = read_back(self.path, before, fids, want=page, since=since)
        return [[m, bytes_to_text(d)] for m, d, _e in recs], start


def lines_of(host, want):
    """(rank, line) of the files ``want(rank)`` accepts, in journal order."""
    out, partial = [], {}
    for meta, data, _e in JournalReader(host.path).read(1 << 30):
        if meta.get("k") != "data" or not want(host.files[meta["f"]]):
            continue
        parts = (partial.pop(meta["f"], "") + data.decode()).split("\n")
        rest = parts.pop()
        if rest:
            partial[meta["f"]] = rest
        out.extend((host.files[meta["f"]], line) for line in parts)
    return out


async def read_all_back(state, source, limit, fetch):
    entries, floors = kept_lines(state, source, limit)
    assert len(entries) <= limit
    scroll = Scrollback(state, source, floors)
    pages = 0
    while not scroll.exhausted:
        older = await scroll.older(fetch)
        entries[:0] = older
        pages += 1
        assert pages < 10_000
    return entries, pages


def make_state(hosts, lines_per_rank):
    state = RunState("r", [(h.name, "127.0.0.1") for h in hosts], lines_per_rank=lines_per_rank)
    return state


@pytest.mark.parametrize("lines_per_rank,page", [(7, 300), (50, 2000), (5000, 10 ** 6)])
def test_one_rank_and_one_node_read_back_exactly(tmp_path, monkeypatch, lines_per_rank, page):
    monkeypatch.setattr(journal_mod, "INDEX_EVERY", 4096)
    rnd = random.Random(lines_per_rank)
    ts = iter(T0 + i * 0.001 for i in range(10 ** 6))
    host = Host(tmp_path / "j", "node1", [0, 1, 2], rnd, ts)
    state = make_state([host], lines_per_rank)
    reader = JournalReader(host.path)
    for _ in range(4):  # arriving in bursts, as over a subscription
        host.write(150, ts)
        host.feed(state, reader)
    for source, want in (((RANK, 1), lambda r: r == 1), ((NODE, "node1"), lambda r: True)):
        entries, pages = asyncio.run(read_all_back(
            state, source, 2 * lines_per_rank,
            lambda n, f, b, s: host.fetch(n, f, b, s, page)))
        assert [(e[2], e[3]) for e in entries] == lines_of(host, want), source
        positions = [(e[4], e[5]) for e in entries]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        if lines_per_rank < 100:
            assert pages > 3  # it really went to the journal, page by page


def test_every_rank_of_several_nodes_merges_by_time(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_mod, "INDEX_EVERY", 2048)
    rnd = random.Random(3)
    clocks = [iter([T0 + i * 0.002 + k * 0.0005 for i in range(20_000)]) for k in range(3)]
    hosts = [Host(tmp_path / ("j%d" % k), "node%d" % k, [2 * k, 2 * k + 1], rnd, clocks[k])
             for k in range(3)]
    state = make_state(hosts, 20)
    readers = [JournalReader(h.path) for h in hosts]
    for _ in range(5):
        for host, reader in zip(hosts, readers):
            host.write(rnd.randint(20, 120), host.tick)  # nodes of different chattiness
            host.feed(state, reader)
    by_name = {h.name: h for h in hosts}
    entries, _pages = asyncio.run(read_all_back(
        state, (ALL, None), 40, lambda n, f, b, s: by_name[n].fetch(n, f, b, s, 1500)))
    assert [e[0] for e in entries] == sorted(e[0] for e in entries)
    want = sorted((meta["ts"], h.name, k, line)
                  for h in hosts for meta, data, _e in JournalReader(h.path).read(1 << 30)
                  if meta.get("k") == "data"
                  for k, line in enumerate(data.decode().split("\n")[:-1]))
    assert [(e[1], e[3]) for e in entries] == [(name, line) for _t, name, _k, line in want]


def test_lines_spread_over_records_lose_nothing(tmp_path, monkeypatch):
    """A line that ends in a later record: joined within a page; across a page boundary it may
    show as two pieces, but no byte of the file is lost or shown twice."""
    monkeypatch.setattr(journal_mod, "INDEX_EVERY", 1024)
    rnd = random.Random(11)
    ts = iter(T0 + i * 0.001 for i in range(10 ** 6))
    host = Host(tmp_path / "j", "node1", [0], rnd, ts, partial=True, streams=("stdout",))
    state = make_state([host], 10)
    reader = JournalReader(host.path)
    for _ in range(3):
        host.write(200, ts)
        host.feed(state, reader)
    entries, _pages = asyncio.run(read_all_back(
        state, (RANK, 0), 10, lambda n, f, b, s: host.fetch(n, f, b, s, 700)))
    shown = "".join(e[3] for e in entries)
    whole = "".join(line for _r, line in lines_of(host, lambda r: r == 0))
    assert shown == whole


@pytest.mark.parametrize("first", [1, 7, 300, 10 ** 6])
def test_a_refill_made_in_two_parts_is_the_same_entries(tmp_path, first):
    """A pane makes entries of the newest chunks at once and of the older ones later
    (console/tui/logpane.py): together they are kept_lines' entries, and the newest part
    holds at least ``first`` lines (all, when fewer are kept)."""
    rnd = random.Random(first)
    ts = iter(T0 + i * 0.001 for i in range(10 ** 6))
    hosts = [Host(tmp_path / ("j%d" % i), "node%d" % i, [2 * i, 2 * i + 1], rnd, ts)
             for i in range(2)]
    state = make_state(hosts, 400)
    for host in hosts:
        reader = JournalReader(host.path)
        host.write(200, ts)
        host.feed(state, reader)
    for source in ((RANK, 1), (NODE, "node1"), (ALL, None)):
        entries, floors = kept_lines(state, source, 700)
        taken, floors2 = kept_chunks(state, source, 700)
        older, newest = split_newest(taken, first)
        assert floors2 == floors
        assert entries_of(older) + entries_of(newest) == entries
        assert len(entries_of(newest)) >= min(first, len(entries))
        assert not older or len(entries_of(newest[1:])) < first  # no more than needed
        marks = {}
        for e in entries:
            if e.journal is not None:
                marks[e.node] = max(marks.get(e.node, (-1, -1)), e.position)
        assert newest_positions(taken) == marks


def test_entries_made_with_the_views_cleaning_equal_cleaned_entries():
    """A refill cleans and masks in the same pass that makes the entries (entries_of with
    ``show``): the same entries as cleaning them after, escapes gone and secrets masked."""
    from console.lines.sanitize import cleaned, shown_text
    secret = "hunter2-abcdef"
    lines = ("plain", "token=%s here" % secret, "\x1b[2Jwiped\x07", "[b]markup[/b]", "x" * 9000)
    taken = [((12.5, 3, "node0", 0, lines, 4), 1), ((0.0, -1, "node1", 1, ("only",), 0), 0)]
    made = entries_of(taken, shown_text([secret]))
    assert made == cleaned(entries_of(taken), [secret])
    assert len(made) == 5 and made[0].index == 5 and made[-1].journal is None
    assert all(secret not in e.text and "\x1b" not in e.text for e in made)
    assert [e.text for e in entries_of(taken)][:2] == ["token=%s here" % secret, "\x1b[2Jwiped\x07"]
