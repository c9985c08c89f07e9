"""Who this console is, who else watches the run, who drives it, and what they did.

Every connection to an agent starts with a ``hello`` request (docs/PROTOCOL.md) carrying
:meth:`Me.hello`: ``user@laptop``, an id for this console process, its role (``drive``, or
``watch``: read-only, which the agent then enforces on that connection) and whether it
attaches (a view that stays: the agents list it among the node's consoles). The agents send
back, per node, the consoles attached (``consoles`` messages) and the lines of the node's
action log (``actions``): :class:`Operators` keeps both for the views.

Which console *drives*: of the consoles attached now that are not read-only, the one that
attached last (a person who opens a driving console takes the wheel; the others see it in
their header). None when only watchers are attached. docs/SECURITY.md says what read-only
does and does not promise.

Everything here comes from the hosts: every text is cleaned (console/lines/sanitize.py) and a
record of the wrong shape is dropped, never fatal.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import time
from dataclasses import dataclass, field

from ..lines.sanitize import clean

TEXT_MAX = 200
# an action's name -> how a line says it was done
DONE = {"launch": "launched", "stop": "stopped", "restart": "restarted", "sync": "synced code to",
        "cordon": "cordoned", "uncordon": "uncordoned", "signal": "signalled",
        "expel": "asked the store on"}


@dataclass
class Me:
    """This console: who runs it, its id (one per process), and whether it only watches."""

    who: str
    console: str
    read_only: bool = False
    attach: bool = False  # a view that stays (listed among the node's consoles)

    @classmethod
    def here(cls, read_only: bool = False, attach: bool = False) -> Me:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "uid%d" % os.getuid()
        laptop = socket.gethostname().split(".")[0] or "laptop"
        return cls("%s@%s" % (user, laptop), secrets.token_hex(4), read_only, attach)

    def hello(self) -> dict:
        """The ``hello`` request's arguments."""
        return {"who": self.who, "console": self.console, "attach": self.attach,
                "role": "watch" if self.read_only else "drive"}


def text(value, limit: int = TEXT_MAX) -> str:
    return clean(str(value), limit=limit) if value is not None else ""


def action_record(rec) -> dict | None:
    """An action log line as sent by an agent, its texts cleaned; None if malformed."""
    if not isinstance(rec, dict) or not isinstance(rec.get("action"), str):
        return None
    ts = rec.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < 2 ** 40:
        return None
    took = rec.get("took_s")
    took = took if isinstance(took, (int, float)) and not isinstance(took, bool) else None
    out = {key: text(rec.get(key)) for key in ("action", "node", "who", "console", "login",
                                               "result", "detail")}
    out["ts"], out["took_s"] = float(ts), took
    return out


def console_record(rec) -> dict | None:
    """One attached console as an agent lists it, cleaned; None if malformed."""
    if not isinstance(rec, dict):
        return None
    since = rec.get("since")
    since = float(since) if isinstance(since, (int, float)) and not isinstance(
        since, bool) else 0.0
    role = "watch" if rec.get("role") == "watch" else "drive"
    return {"who": text(rec.get("who")) or "?", "console": text(rec.get("console"), 40),
            "login": text(rec.get("login")), "role": role, "since": since}


def action_line(rec: dict) -> str:
    """``bob@laptop (login alice) restarted node1: ok`` - one action in words."""
    done = DONE.get(rec["action"], rec["action"])
    what = "%s %s" % (done, rec["node"] or "the run")
    if rec.get("detail"):
        what += " (%s)" % rec["detail"]
    who = rec["who"] or "?"
    if rec.get("login"):
        who += " (login %s)" % rec["login"]
    return "%s %s: %s" % (who, what, rec["result"] or "?")


MAX_ACTIONS = 10_000  # kept in memory, as `rankdeck actions` lists at most


@dataclass
class Operators:
    """The consoles attached to a run and its action log, from every node's agent."""

    me: Me | None = None
    consoles: dict[str, list[dict]] = field(default_factory=dict)  # node -> attached
    actions_from: dict[str, int] = field(default_factory=dict)  # node -> log offset read
    # the newest actions seen, in arrival order (MAX_ACTIONS: a host's log is untrusted and a
    # watcher's refused requests once wrote thousands a second)
    actions: list[dict] = field(default_factory=list)

    def apply_consoles(self, node: str, items) -> None:
        if isinstance(items, list):
            self.consoles[node] = [c for c in map(console_record, items[:256]) if c]

    def apply_actions(self, node: str, recs, end, add_event) -> None:
        """New lines of ``node``'s action log; another console's become events
        (``add_event(node, kind, text, ts=...)``: RunState's) as they happen: the first
        message of a node (the agent sends one at once) is its history, which ``rankdeck
        actions`` prints; at 512 nodes a launch is 512 lines the events pane need not show."""
        if not isinstance(recs, list) or isinstance(end, bool) or not isinstance(end, int):
            return
        history = node not in self.actions_from
        self.actions_from[node] = max(self.actions_from.get(node, 0), end)
        mine = self.me.console if self.me else None
        for rec in filter(None, map(action_record, recs)):
            self.actions.append(rec)
            if len(self.actions) > MAX_ACTIONS:
                del self.actions[:len(self.actions) - MAX_ACTIONS]
            if not history and rec["console"] != mine:
                add_event(rec["node"] or node, "action", action_line(rec), ts=rec["ts"])

    def attached(self) -> list[dict]:
        """The consoles attached to any node, each once (by its id), oldest first."""
        seen: dict[str, dict] = {}
        for items in self.consoles.values():
            for c in items:
                seen.setdefault(c["console"] or c["who"], c)
        return sorted(seen.values(), key=lambda c: c["since"])

    def driver(self) -> dict | None:
        """The console that drives: the newest attached one that is not read-only."""
        driving = [c for c in self.attached() if c["role"] == "drive"]
        return driving[-1] if driving else None

    def summary(self) -> str:
        """What the header says: ``read-only``, how many consoles, who drives; "" when this
        is the only console and it drives."""
        parts = []
        mine = self.me.console if self.me else None
        if self.me is not None and self.me.read_only:
            parts.append("READ-ONLY")
        consoles = self.attached()
        driver = self.driver()
        if consoles and (len(consoles) > 1 or driver is None or driver["console"] != mine):
            parts.append("%d console%s" % (len(consoles), "" if len(consoles) == 1 else "s"))
            if driver is None:
                parts.append("nobody drives")
            elif driver["console"] == mine:
                parts.append("you drive")
            else:
                parts.append("%s drives" % driver["who"])
        return " · ".join(parts)


def when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
