"""A log source: the lines one pane follows, a rank, a whole node merged, or every rank.

A source is a pair ``(kind, value)``: ``(RANK, 5)``, ``(NODE, "node1")``, ``(ALL, None)``.
The feed keeps lines per source (console/tui/feed.py), the panes show one each, and
scrolling back asks the nodes a source's lines come from for its files
(console/model/scrollback.py). These helpers say which nodes, files and kept lines of RunState a
source covers. Plain code: no asyncio, no Textual.
"""

from __future__ import annotations

from .buffers import Kept
from .state import RunState

RANK, NODE, ALL = "rank", "node", "all"


def source_label(source: tuple) -> str:
    """What a pane's title calls its source: ``rank 5``, ``node node1 merged``..."""
    kind, value = source
    if kind == RANK:
        return "rank %s" % value
    if kind == NODE:
        return "node %s merged" % value
    return "all ranks merged"


def rank_of(rank: int | None, stream: str) -> int | None:
    """The rank an entry of a file shows: -1 for torchrun's own output, None if unknown."""
    return -1 if rank is None and stream == "torchrun" else rank


def nodes_of(state: RunState, source: tuple) -> list[str]:
    """The nodes a source's lines can come from."""
    kind, value = source
    if kind == NODE:
        return [value] if value in state.nodes else []
    if kind == ALL:
        return list(state.nodes)
    return [name for name, ns in state.nodes.items()
            if any(fi.rank == value for fi in ns.files.values())]


def fids_of(state: RunState, source: tuple, node: str) -> tuple[list[int], int]:
    """The node's file ids whose lines a source shows, and where the first was announced."""
    files = state.nodes[node].files
    if source[0] == RANK:
        fids = sorted(fid for fid, fi in files.items() if fi.rank == source[1])
    else:
        fids = sorted(files)
    announced = [files[fid].journal for fid in fids]
    return fids, (0 if None in announced or not announced else min(announced))


def streams_of(state: RunState, source: tuple) -> list[tuple[int | None, Kept]]:
    """``(rank, kept lines)`` of a source (rank -1: torchrun's own output, None: unknown)."""
    kind, value = source
    if kind == RANK:
        rs = state.ranks.get(value)
        return [(value, rs.lines)] if rs is not None else []
    nodes = nodes_of(state, source)
    streams = [(-1, state.nodes[name].lines) for name in nodes]
    if kind == ALL:
        return streams + [(rs.rank, rs.lines) for rs in state.ranks.values()]
    ranks_here = {fi.rank for fi in state.nodes[value].files.values()} if nodes else set()
    return streams + [(rs.rank, rs.lines) for rs in state.ranks.values()
                      if rs.rank in ranks_here]
