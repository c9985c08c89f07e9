"""Which node runs a rank, and how much one node's `file` records may make the console keep.

A node claims a global rank with each `file` record of one of its workers. Ranks move
between nodes across restarts (torchrun hands them out again at each rendezvous: see
docs/DESIGN-NOTES.md, the journal), and the nodes' journals reach the console in no order
between them: node B's new worker for rank 3 may arrive before node A's new workers show
that A gave rank 3 up. So a claim is never refused for that; the rule is:

- a node **runs** a rank when it has not ended (nor is being restarted) and a file of its
  newest torchrun attempt (instance, attempt) is that rank's;
- a claim on a rank no other node runs is granted at once (the rank moves);
- a claim on a rank another node runs is **held**: its lines stay on the claiming node, its
  metrics count for no rank, until the owner lets the rank go (a newer attempt of its own, an
  end, a restart); a held claim whose own node moved on to a newer attempt is dropped.

A node never takes over a rank another node still runs. What a node may make the console
keep is bounded by its processes (``slots``, or the launch's --nproc-per-node): ranks and
files of its newest attempt, files of older attempts (the oldest are forgotten), torchrun
instances. Past a bound its records are a ProtocolError: the node shows ``protocol error``.
"""

from __future__ import annotations

from agent.wire import protocol

DEFAULT_SLOTS = 8  # a node's processes when the state is not told (a GPU node's usual 8)
RANKS_PER_SLOT = 4  # ranks one attempt of a node may claim, per process it runs
FILES_PER_RANK = 2  # a worker's stdout and stderr
NODE_FILES = 8  # files of no attempt (torchrun's own log)
INSTANCES_MAX = 1024  # torchrun starts on one node (each rankdeck restart is one)


def generation(fi) -> tuple | None:
    """(instance, attempt) of a worker's file; None for a file of no attempt."""
    if fi.instance is None or fi.attempt is None:
        return None
    return fi.instance, fi.attempt


def newest(ns) -> tuple | None:
    """The node's newest torchrun attempt it has announced files of."""
    if ns.instance is None or ns.instance not in ns.attempts:
        return None
    return ns.instance, ns.attempts[ns.instance]


def runs(ns, rank: int) -> bool:
    """``ns`` still runs ``rank``: it goes on, and a file of its newest attempt is that rank's,
    the newest of its worker's (local rank, stream): a membership change re-runs the
    rendezvous with the same attempt and possibly other ranks (agent/torchrun/log.py), so a
    worker's older file of that attempt claims a rank the node gave up (a cordon's spare
    then waited for it for good, its claim held)."""
    if ns.ended or ns.state == "restarting":
        return False
    gen = newest(ns)
    if gen is None:
        return False
    current = {}
    for fi in ns.files.values():
        key = (fi.local_rank, fi.stream)
        if generation(fi) == gen and (key not in current or fi.fid > current[key].fid):
            current[key] = fi
    return any(fi.rank == rank for fi in current.values())


def ranks_cap(ns, nproc: int | None) -> int:
    return RANKS_PER_SLOT * max(ns.slots, nproc or 1)


def check_claim(ns, fi, rank: int | None, nproc: int | None) -> None:
    """ProtocolError when the file ``fi`` (not yet kept) would take ``ns`` past its bounds.

    Usually means the host runs something that is not a rankdeck agent, or a broken one.
    """
    if fi.instance is not None and fi.instance not in ns.attempts \
            and len(ns.attempts) >= INSTANCES_MAX:
        _bad("%s announced more than %d torchrun starts" % (ns.name, INSTANCES_MAX))
    gen = generation(fi)
    mates = [f for f in ns.files.values() if generation(f) == gen and f.fid != fi.fid]
    if gen is None:
        if len(mates) >= NODE_FILES:
            _bad("%s announced more than %d files of no torchrun attempt" % (ns.name, NODE_FILES))
        return
    cap = ranks_cap(ns, nproc)
    if len(mates) >= FILES_PER_RANK * cap:
        _bad("%s announced more than %d files in one torchrun attempt (it runs %d processes)"
             % (ns.name, FILES_PER_RANK * cap, cap // RANKS_PER_SLOT))
    claimed = {f.rank if f.rank is not None else f.claim for f in mates} - {None}
    if rank is not None and rank not in claimed and len(claimed) >= cap:
        _bad("%s claims more than %d ranks in one torchrun attempt (it runs %d processes)"
             % (ns.name, cap, cap // RANKS_PER_SLOT))


def forget_old_files(ns, nproc: int | None) -> None:
    """Keep at most as many files of older attempts as one attempt may have: the oldest go
    (their late bytes, if any, land on the node's own lines)."""
    gen = newest(ns)
    old = [fid for fid, f in ns.files.items() if generation(f) not in (None, gen)]
    extra = len(old) - FILES_PER_RANK * ranks_cap(ns, nproc)
    for fid in sorted(old)[:max(0, extra)]:
        del ns.files[fid]


def can_take(state, ns, rank: int) -> bool:
    """``ns`` may have ``rank`` now: no other node runs it."""
    rs = state.ranks.get(rank)
    if rs is None or rs.node == ns.name or rs.state in ("exited", "failed"):
        return True
    owner = state.nodes.get(rs.node)
    return owner is None or not runs(owner, rank)


def idle_ranks(state) -> list[int]:
    """Ranks no node runs any more (oldest first): what may go when ranks are too many."""
    return [r for r, rs in state.ranks.items()
            if rs.node not in state.nodes or not runs(state.nodes[rs.node], r)]


def _bad(reason: str):
    raise protocol.ProtocolError(reason)
