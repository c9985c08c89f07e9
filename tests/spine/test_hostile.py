"""Hostile output from one rank, with real torchrun: 4 ranks on 2 local nodes of 2.

Rank 1 (tests/spine/hostile_writer.py) writes a 50 MB line without a newline, bytes that are
not UTF-8, NUL bytes, ANSI escapes, markup-like text, a line of tabs and 100k lines in one
burst; the other ranks write a numbered line every 20 ms the whole time. The console must stay
up, keep its memory bounded, keep the other ranks' lines flowing, lose nothing of the host's
files, and its sanitizer must make every line safe to show.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import sys
from collections import defaultdict

import pytest

from agent.wire.protocol import text_to_bytes
from console.lines import sanitize
from console.records.history import History
from console.run.run import LaunchSpec, RunController
from console.lines.lines import MAX_PARTIAL
from console.transport.local import LocalTransport
from tests.waits import wait_for

from .helpers import ENDED, local_inventory, rank_log_files, wind_down

pytestmark = pytest.mark.e2e
TIMEOUT = 300
HERE = os.path.dirname(os.path.abspath(__file__))
WRITER = os.path.join(HERE, "hostile_writer.py")
BIG_MB = 50
BURST = 100_000
SLACK = 64  # a stored line may exceed MAX_PARTIAL by this much at most
CLEAN_SLACK = 30  # sanitize.clean's " … [+N chars]" marker
MAX_RSS_GROWTH = 600 * 1024 * 1024
SEQ = re.compile(r"^seq=(\d+) rank=(\d+) t=")


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM (Linux >= 4.0: ``5`` to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def vm_status(key: str) -> int:
    """VmRSS / VmHWM of this process in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def unsafe(text: str) -> list[str]:
    """What is wrong with a line that clean() returned ([] when nothing)."""
    bad = []
    if "\x1b" in text:
        bad.append("ESC")
    if "\x00" in text:
        bad.append("NUL")
    if any(ord(c) < 0x20 for c in text):
        bad.append("C0 control %r" % sorted({c for c in text if ord(c) < 0x20}))
    if any(0x7F <= ord(c) <= 0x9F for c in text):
        bad.append("DEL/C1 control")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        bad.append("lone surrogate")
    if len(text) > sanitize.MAX_LINE + CLEAN_SLACK:
        bad.append("%d chars (cap %d)" % (len(text), sanitize.MAX_LINE))
    return bad


class Collector:
    """Listens to every LineBatch: exact bytes per file (hashed), order of arrival, checks."""

    def __init__(self):
        self.hash = defaultdict(hashlib.sha256)
        self.size = defaultdict(int)
        self.offset_errors = []
        self.arrivals = 0  # batches so far, all nodes
        self.seqs = defaultdict(list)  # rank -> seq numbers in arrival order
        self.steady_done = {}  # rank -> seqs it says it wrote
        self.other_at = []  # arrival index of every batch with other ranks' seq lines
        self.hostile_first = None  # arrival index of rank 1's first big-line bytes
        self.hostile_last = None  # arrival index of rank 1's "hostile end"
        self.hostile_batches = 0
        self.hostile_max_text = 0
        self.longest_line = (0, None, None)
        self.unsafe = []  # (rank, what, line start)
        self.hostile_seen = set()
        self.burst_lines = 0

    def __call__(self, b) -> None:
        self.arrivals += 1
        data = text_to_bytes(b.text)
        key = (b.node, b.path)
        if b.offset != self.size[key]:
            self.offset_errors.append((key, b.offset, self.size[key]))
        self.hash[key].update(data)
        self.size[key] = b.offset + len(data)
        for line in b.lines:  # exactly what RunState stores for this batch
            if len(line) > self.longest_line[0]:
                self.longest_line = (len(line), b.node, b.rank)
            shown = sanitize.clean(line)
            bad = unsafe(shown)
            if bad and len(self.unsafe) < 20:
                self.unsafe.append((b.rank, bad, line[:60]))
        if b.rank == 1 and b.stream == "stdout":
            self.hostile_batches += 1
            self.hostile_max_text = max(self.hostile_max_text, len(b.text))
            if self.hostile_first is None and "0123456789abcdef" in b.text:
                self.hostile_first = self.arrivals
            if "hostile end t=" in b.text:
                self.hostile_last = self.arrivals
            for line in b.lines:
                if line.startswith("burst "):
                    self.burst_lines += 1
                for tag in ("invalid utf-8", "nul bytes", "lone escape", "[rank0]:", "tabs",
                            "progress 100%"):
                    if tag in line:
                        self.hostile_seen.add(tag)
        elif b.rank is not None and b.stream == "stdout":
            got = False
            for line in b.lines:
                m = SEQ.match(line)
                if m:
                    self.seqs[int(m.group(2))].append(int(m.group(1)))
                    got = True
                elif line.startswith("steady done seqs="):
                    self.steady_done[b.rank] = int(line.split("=")[1])
            if got:
                self.other_at.append(self.arrivals)


def sha256_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return h.hexdigest(), size
            h.update(chunk)
            size += len(chunk)


def links_whole(broken: list) -> None:
    """Fails at once when a link broke (an ``unreachable`` event, kept in ``broken``)."""
    if broken:
        raise AssertionError("the console's link to a node broke during the hostile "
                             "output: %s" % [(e.node, e.text) for e in broken])


async def wait_end(ctl: RunController, broken: list) -> str:
    await wait_for(lambda: links_whole(broken) or ctl.state.run_state() in ENDED, TIMEOUT,
                   lambda: "the run to end (it is %s)" % ctl.state.run_state())
    return ctl.state.run_state()


async def caught_up(ctl: RunController, broken: list) -> dict:
    """Wait until the console has every node's journal to its (final) end; {node: size}."""
    sizes = {}
    for name, link in ctl.links.items():
        st = await link.request("state", run_root=link.run_root, node=name)
        sizes[name] = st.get("journal_size") or 0
    await wait_for(lambda: links_whole(broken) or all(
        ctl.state.nodes[n].journal_offset >= size for n, size in sizes.items()), TIMEOUT,
        "every node's journal read to its end")
    return sizes


async def test_hostile_rank_output_console_stays_up_bounded_and_exact(tmp_path):
    work = tmp_path / "work"
    flags = tmp_path / "flags"
    flags.mkdir()
    # 2 nodes of 2 ranks: rank 0 shares rank 1's node (its supervisor, journal and link),
    # ranks 2 and 3 are on the other; each node less is one torchrun's torch start-up less
    ctl = RunController(local_inventory(work, n=2), LocalTransport(), History())
    got = Collector()
    ctl.state.line_listeners.append(got)
    broken = []
    ctl.state.event_listeners.append(
        lambda ev: broken.append(ev) if ev.kind == "unreachable" else None)

    hwm_reset = reset_peak_rss()
    rss_before, maxrss_before = vm_status("VmRSS"), maxrss()
    try:
        await ctl.launch(LaunchSpec(script=WRITER, max_restarts=0, grace=5, nproc_per_node=2,
                                    args=["--flag-dir", str(flags), "--big-mb", str(BIG_MB),
                                          "--burst", str(BURST)]), preflight=False)
        final = await wait_end(ctl, broken)
        # what the console had of each file when it declared the run over ...
        at_end = dict(got.size)
        # ... and all of it (the nodes' journals read to their end)
        await caught_up(ctl, broken)
        await ctl.stop_store()
    finally:
        left = await wind_down(ctl)
    peak_growth = (vm_status("VmHWM") if hwm_reset else maxrss()) - rss_before
    maxrss_growth = maxrss() - maxrss_before
    print("\nhostile rank: %d batches, largest %d chars; longest stored line %s; "
          "peak RSS growth %.0f MB (getrusage %.0f MB); other ranks' batches between rank 1's "
          "first and last: %d" % (
              got.hostile_batches, got.hostile_max_text, got.longest_line,
              peak_growth / 2**20, maxrss_growth / 2**20,
              sum(1 for a in got.other_at if got.hostile_first is not None
                  and got.hostile_last is not None and got.hostile_first < a < got.hostile_last)),
          file=sys.stderr)

    # the console stayed up and the run ended well
    assert not broken, [(e.node, e.text) for e in broken]
    assert final == "succeeded", ctl.state.status()
    assert not left, "processes left behind: %s" % left
    late = {k: v - at_end.get(k, 0) for k, v in got.size.items() if v != at_end.get(k, 0)}
    assert not late, ("the run was reported %r while output was still on its way: bytes "
                      "received after that, per file: %s" % (final, late))
    assert got.hostile_seen == {"invalid utf-8", "nul bytes", "lone escape", "[rank0]:",
                                "tabs", "progress 100%"}, got.hostile_seen
    assert got.burst_lines == BURST

    # memory stays bounded
    for rs in ctl.state.ranks.values():
        assert len(rs.lines) <= rs.lines.cap
        assert all(len(line) <= MAX_PARTIAL + SLACK for line in rs.lines), rs.rank
    for ns in ctl.state.nodes.values():
        assert len(ns.lines) <= ns.lines.cap
        assert all(len(fi.partial) <= MAX_PARTIAL for fi in ns.files.values())
    assert got.longest_line[0] <= MAX_PARTIAL + SLACK, (
        "RunState stored a line of %d chars (node %s rank %s): the 50 MB line must arrive "
        "in bounded pieces" % got.longest_line)
    assert peak_growth < MAX_RSS_GROWTH, "peak RSS grew by %.0f MB" % (peak_growth / 2**20)
    assert maxrss_growth < MAX_RSS_GROWTH, "ru_maxrss grew by %.0f MB" % (maxrss_growth / 2**20)

    # the other ranks' lines kept flowing: every seq number, in order, none missing
    others = sorted(r for r in ctl.state.ranks if r != 1)
    assert others == [0, 2, 3]
    for rank in others:
        seqs = got.seqs[rank]
        assert rank in got.steady_done, "rank %d's last line never arrived" % rank
        assert seqs == list(range(got.steady_done[rank])), (
            "rank %d: %d seqs, first gap at %s" % (rank, len(seqs), next(
                (i for i, s in enumerate(seqs) if s != i), None)))
    # ... and arrived interleaved with rank 1's hostile output, not only after it
    assert got.hostile_first is not None and got.hostile_last is not None
    assert any(got.hostile_first < a < got.hostile_last for a in got.other_at), (
        "no other rank's line arrived while rank 1's output was being delivered")

    # nothing lost: what the console received of every file equals the file, byte for byte
    assert not got.offset_errors, got.offset_errors[:5]
    for node in ctl.state.nodes:
        files = rank_log_files(work, ctl.run_id, node)
        assert files, node
        for path in files:
            digest, size = sha256_file(path)
            key = (node, path)
            assert got.size.get(key, 0) == size, (path, got.size.get(key, 0), size)
            if size:
                assert got.hash[key].hexdigest() == digest, path
    for (node, path), size in got.size.items():  # torchrun.log and anything else followed
        digest, on_disk = sha256_file(path)
        assert size == on_disk and got.hash[(node, path)].hexdigest() == digest, path

    # the sanitizer makes every stored line safe to show
    assert not got.unsafe, got.unsafe
    for rs in ctl.state.ranks.values():
        for line in rs.lines:
            assert not unsafe(sanitize.clean(line)), (rs.rank, line[:60])


def test_clean_caps_the_line_last_and_never_shows_part_of_a_secret():
    """The cap holds after tab expansion, and a secret across the cap is masked, not cut."""
    tabs = sanitize.clean("\t" * 5000 + "end")
    assert len(tabs) <= sanitize.MAX_LINE + CLEAN_SLACK, len(tabs)
    secret = "tok-abcdef123456"
    shown = sanitize.clean("x" * (sanitize.MAX_LINE - 6) + secret, secrets=[secret])
    assert "tok-ab" not in shown, shown[-40:]
    assert len(shown) <= sanitize.MAX_LINE + CLEAN_SLACK
