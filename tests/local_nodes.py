"""Inventories of N local nodes, as an object or as a file a command reads with ``-i``.

Node ``i`` (from ``first``) is ``node<i>`` at 127.0.0.<i+2-first>: every address is this machine
(the local transport), yet each node has one of its own for the rendezvous, as on a cluster.
``workdir`` is one folder for every node, or a list: one folder each.
"""

from __future__ import annotations

import os

from inventory.model import Host, Inventory


def _workdirs(workdir, n: int) -> list[str]:
    if isinstance(workdir, (list, tuple)):
        assert len(workdir) == n, (workdir, n)
        return [str(w) for w in workdir]
    return [str(workdir)] * n


def local_inventory(workdir="~", n: int = 4, *, first: int = 0, python: str = "",
                    path: str = "<test>", spares=(), **host) -> Inventory:
    """``n`` local nodes as an Inventory; ``host``: more Host fields (slots, ...) for each,
    ``spares``: the indexes of standby nodes. ``python`` empty: the console's own."""
    hosts = [Host(name="node%d" % (first + i), addr="127.0.0.%d" % (i + 2), python=python,
                  workdir=w, spare=i in spares, **host)
             for i, w in enumerate(_workdirs(workdir, n))]
    return Inventory(path=path, hosts=hosts, transport="local")


def write_inventory(folder, workdir, n: int = 4, defaults: str = "") -> str:
    """``folder``/hosts.yaml: ``n`` local nodes, each workdir made (preflight refuses a
    missing one). ``defaults``: the YAML lines under ``defaults:``, indented two spaces."""
    workdirs = _workdirs(workdir, n)
    for w in workdirs:
        os.makedirs(w, exist_ok=True)
    path = os.path.join(str(folder), "hosts.yaml")
    with open(path, "w") as f:
        f.write("transport: local\n" + ("defaults:\n" + defaults if defaults else "")
                + "hosts:\n" + "".join("  - {name: node%d, addr: 127.0.0.%d, workdir: %s}\n"
                                       % (i, i + 2, w) for i, w in enumerate(workdirs)))
    return path
