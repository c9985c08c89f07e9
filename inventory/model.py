"""The inventory as plain data: what the loader produces and the console consumes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# what may start each node's ranks (console/launch/launchers.py has their templates)
LAUNCHERS = ("torchrun", "deepspeed", "accelerate")


@dataclass(frozen=True)
class EnvValue:
    """One environment value for the run. Secret values are masked in every output, and so
    are their ``parts``: what each ``${VAR}`` filled in (``Bearer ${TOKEN}``: the token)."""

    value: str
    secret: bool = False
    parts: tuple[str, ...] = field(default=(), compare=False)

    def shown(self) -> str:
        return "****" if self.secret else self.value


@dataclass
class Host:
    """One node of a run.

    ``ssh`` is what to connect to: an ``~/.ssh/config`` alias or ``[user@]host[:port]``; None
    for the local transport. ``addr`` is the address the other nodes use to reach this one
    (rendezvous, ``--local-addr``). ``python`` is the training interpreter on the host; for the
    local transport an empty value means the console's own interpreter.
    """

    name: str
    addr: str
    ssh: str | None = None
    python: str = "python3"
    workdir: str = "~"
    slots: int = 1
    gpus: int = 0
    env: dict[str, EnvValue] = field(default_factory=dict)
    line: int = 0  # where the host is defined in its file, for error messages
    # a standby node: it gets the agent, preflight and the code like the others, but no
    # torchrun until an operator puts it in for a cordoned node (docs/SURGERY.md)
    spare: bool = False


@dataclass
class Inventory:
    """A loaded, validated inventory. ``transport`` is "ssh" or "local"."""

    path: str
    hosts: list[Host]
    transport: str = "ssh"
    name: str = ""
    # defaults.sync: the folder `launch` sends to every host's workdir (absolute; a relative
    # one in the file is read against the inventory's folder). None: nothing is sent.
    sync: str | None = None
    # a shell command the run's judge runs on its host for each event (docs/JUDGE.md);
    # `launch --notify` overrides it
    notify: str | None = None
    # `[ADDR:]PORT` where the run's judge serves Prometheus metrics (docs/PROMETHEUS.md);
    # `launch --prometheus` overrides it
    prometheus: str | None = None
    # launcher: what starts each node's ranks (LAUNCHERS); `launch --launcher` overrides it
    launcher: str = "torchrun"
    # the host of the run's rendezvous store and judge, by name (docs/SURGERY.md: it must
    # outlive any node an operator may cordon); None: the first spare, else the first host
    store: str | None = None

    @property
    def active(self) -> list[Host]:
        """The hosts a launch starts torchrun on (every host that is not a spare)."""
        return [h for h in self.hosts if not h.spare]

    @property
    def spares(self) -> list[Host]:
        return [h for h in self.hosts if h.spare]

    def mark_spares(self, names: list[str]) -> None:
        """``launch --spares A,B``: those hosts are spares. KeyError names an unknown one."""
        for name in names:
            self.host(name).spare = True

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def resolve_local(self, base: str) -> Inventory:
        """Local hosts: make relative workdirs absolute against ``base`` (the run folders
        must not move when the console is started from another directory). Returns self."""
        if self.transport == "local":
            for h in self.hosts:
                h.workdir = os.path.abspath(os.path.join(base, os.path.expanduser(h.workdir)))
        return self

    @property
    def secrets(self) -> list[str]:
        """Every secret value and every part of one, for masking output."""
        return sorted({s for h in self.hosts for v in h.env.values() if v.secret
                       for s in (v.value,) + v.parts if s})


def too_long_number(length: int) -> str:
    """The error for a number of ``length`` digits, more than Python converts (4300)."""
    return (f"a number of {length} digits is too long for any key of an inventory "
            "(slots and gpus are e.g. 8); shorten it")


class InventoryError(Exception):
    """A mistake in an inventory: ``file:line: what is wrong and how to fix it``."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")
