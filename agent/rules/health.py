"""The deep check's network rule (``rankdeck check --deep``, docs/HEALTH.md): which pairs of
nodes are measured in which round, and which node or link the figures name. Plain data, no
I/O, standard library only (Python >= 3.9): the probe on the hosts plans its rounds with it
(agent/serve/netprobe.py) and the console judges the figures with it (console/run/deep.py).

Rounds: in round ``k`` node ``i`` is paired with node ``i XOR 2**k`` (when that node exists),
every pair of a round measured at once; ``ceil(log2 n)`` rounds in all (one more where ``n`` is not a power of two), against ``n(n-1)/2``
pairs for every pair one by one. A pair's figure is the slower direction of a two-way
exchange, in Gbit/s.

Who is named: a node's figure is its best pair's; the reference is the median of the nodes'
figures. A pair below ``SLOW_FRACTION`` of the reference is slow. A node whose every pair is
slow (it took part in at least two) is a slow node. A slow pair with neither end a slow node
(a link slow in one round only, or a node measured once) is measured again, each end against
a third, healthy node: the end slow again is a slow node; if neither is, the link itself is
named. A healthy node or link is never named.
"""

from statistics import median

SLOW_FRACTION = 1.0 / 3.0  # a pair or node under a third of the median is named
MAX_RECHECKS = 4  # slow pairs measured again, at most (each adds one or two rounds)


def rounds(n):
    """The rounds for ``n`` nodes: a list of rounds, each a list of ``(a, b)`` pairs, a < b.
    Where ``n`` is not a power of two, a node left with one partner (node 0 would be the
    only partner of the last nodes, and a slow node 0 would drag them all down) gets a
    second one in a last round."""
    out, k = [], 0
    while (1 << k) < n:
        out.append([(i, i ^ (1 << k)) for i in range(n) if i < (i ^ (1 << k)) < n])
        k += 1
    partners = {i: set() for i in range(n)}
    for r in out:
        for a, b in r:
            partners[a].add(b)
            partners[b].add(a)
    want = min(2, n - 1)
    for _ in range(2):
        needy = [i for i in range(n) if len(partners[i]) < want]
        if not needy:
            break
        busy, extra = set(), []
        for i in needy:
            if i in busy:
                continue
            free = [j for j in range(n) if j != i and j not in busy and j not in partners[i]]
            free.sort(key=lambda j: (j not in needy, j))
            if free:
                j = free[0]
                extra.append((min(i, j), max(i, j)))
                busy.update((i, j))
                partners[i].add(j)
                partners[j].add(i)
        out.append(extra)
    return out


def every_pair(n):
    """How many pairs testing every pair of ``n`` nodes measures."""
    return n * (n - 1) // 2


def best_figures(n, pairs):
    """``{node: best Gbit/s of its pairs}`` for the nodes that took part in a pair."""
    best = {}
    for a, b, gbps in pairs:
        for node in (a, b):
            if gbps is not None and (node not in best or gbps > best[node]):
                best[node] = gbps
    return best


def reference(n, pairs):
    """The median of the nodes' best figures (None with no figure)."""
    best = best_figures(n, pairs)
    return median(best.values()) if best else None


def first_look(n, pairs):
    """``(slow_nodes, unexplained)`` from the regular rounds' ``pairs`` ([(a, b, gbps)]):
    the nodes slow in every pair (two pairs at least), and the slow pairs they do not explain."""
    ref = reference(n, pairs)
    if ref is None or ref <= 0:
        return set(), []
    floor = ref * SLOW_FRACTION
    seen, slow_in = {}, {}
    for a, b, gbps in pairs:
        for node in (a, b):
            seen[node] = seen.get(node, 0) + 1
            if gbps is None or gbps < floor:
                slow_in[node] = slow_in.get(node, 0) + 1
    slow = {node for node, count in seen.items() if count >= 2 and slow_in.get(node) == count}
    unexplained = [(a, b) for a, b, gbps in pairs if (gbps is None or gbps < floor)
                   and a not in slow and b not in slow]
    return slow, unexplained[:MAX_RECHECKS]


def recheck_rounds(n, pairs):
    """The extra rounds that tell a slow node from a slow link: each unexplained slow pair's
    ends measured against a third node that is healthy (its pairs all above the floor)."""
    slow, unexplained = first_look(n, pairs)
    if not unexplained:
        return []
    ref = reference(n, pairs)
    floor = ref * SLOW_FRACTION
    suspect = set(slow)
    for a, b, gbps in pairs:
        if gbps is None or gbps < floor:
            suspect.update((a, b))
    healthy = [i for i in range(n) if i not in suspect]
    out = []
    for a, b in unexplained:
        thirds = [c for c in healthy if c not in (a, b)]
        if not thirds:
            continue
        c1 = thirds[0]
        c2 = thirds[1] if len(thirds) > 1 else None
        if c2 is None:
            out += [[tuple(sorted((a, c1)))], [tuple(sorted((b, c1)))]]
        else:
            out.append([tuple(sorted((a, c1))), tuple(sorted((b, c2)))])
    return out


def verdict(n, pairs, rechecked):
    """What the figures name: ``{"reference", "floor", "nodes": {node: best}, "slow_nodes":
    [node], "slow_links": [(a, b, gbps)]}``. ``pairs``: the regular rounds' (a, b, gbps);
    ``rechecked``: the extra rounds' (a, b, gbps)."""
    ref = reference(n, pairs)
    best = best_figures(n, pairs)
    out = {"reference": ref, "floor": None, "nodes": best, "slow_nodes": [],
           "slow_links": []}
    if ref is None or ref <= 0:
        return out
    floor = out["floor"] = ref * SLOW_FRACTION
    slow, unexplained = first_look(n, pairs)
    again = {}
    for a, b, gbps in rechecked:
        again[(a, b)] = again[(b, a)] = gbps
    figure = {(a, b): gbps for a, b, gbps in pairs}
    for a, b in unexplained:
        ends = []
        for end in (a, b):
            other = [g for (x, y), g in again.items() if x == end and y not in (a, b)]
            if other:
                ends.append((end, all(g is None or g < floor for g in other)))
        slow_ends = [end for end, is_slow in ends if is_slow]
        if slow_ends:
            slow.update(slow_ends)
        else:
            out["slow_links"].append((a, b, figure.get((a, b))))
    out["slow_nodes"] = sorted(slow)
    return out
