"""The events pane's lines: one idea per line, a checkpoint step's saves on one line, alerts
marked.

An event's text often starts with its kind (``preflight ok ...``, ``rendezvous store at
...``, ``checkpoint step 20 saved: ...``): the pane shows the text alone then, its kind word
coloured, so nothing reads twice. Every node's ``checkpoint``, ``checkpoint complete`` and
``checkpoint incomplete`` of one step fold into one line where the first of them would be,
``ckpt 20 ✓ 4 nodes × 1.4 MiB 0.9 s``, and their deletions into ``ckpt 10 deleted on 4
nodes``; their paths are in the events screen (Enter on the pane). The events a person must not miss (a crash, a stall, a verdict, a diverged loss, an
incomplete save) are ALERTS: their line is highlighted and the pane pins the latest one.
RunState's texts stay as they are: the no-TUI output, reports and tests read them.
"""

from __future__ import annotations

import re

from rich.text import Text

from ..lines.sanitize import clean
from ..model.state import RunState
from ..model.nodes import Event
from ..lines.text import clock_text, human_bytes

KIND_STYLE = {
    "checkpoint": "green", "launched": "cyan", "rendezvous": "cyan", "restarting": "magenta",
    "restarted": "magenta", "reconnected": "cyan", "killed": "magenta", "stopping": "magenta",
    "exited": "green", "stopped": "dim", "recovered": "green", "preflight": "cyan",
}
# the whole line highlighted, and the latest pinned under the pane
ALERTS = {
    "failed": "bold white on red", "worker failed": "bold white on red",
    "lost": "bold white on red", "gone": "bold white on red", "unreachable": "bold white on red",
    "diverged": "bold white on red", "checkpoint incomplete": "bold white on red",
    "stalled": "bold black on yellow", "verdict": "bold black on yellow",
    "refused": "bold black on yellow", "stream stopped": "bold white on red",
}
CHECKPOINT_KINDS = ("checkpoint", "checkpoint complete", "checkpoint incomplete",
                    "checkpoint deleted")
STEP_OF = re.compile(r"^checkpoint step (\S+) (saved|complete|incomplete|deleted)")


def checkpoint_step(ev: Event) -> str | None:
    """What line a checkpoint event folds into: its step (as its text says it), with
    ``deleted`` after it for a deletion (the trainer pruning old saves: a line of its own,
    when it happens); None: not a checkpoint event."""
    if ev.kind not in CHECKPOINT_KINDS:
        return None
    found = STEP_OF.match(ev.text)
    if not found:
        return None
    return found.group(1) + (" deleted" if ev.kind == "checkpoint deleted" else "")


def who_of(ev: Event) -> str:
    return (ev.node or "") + ("/r%d" % ev.rank if ev.rank is not None else "")


def event_text(ev: Event, secrets=()) -> Text:
    """One event on one line: time, node/rank, what happened (the kind said once)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(clock_text(ev.ts) + " ", "dim")
    who = who_of(ev)
    if who:
        text.append(clean(who, secrets) + " ", "bold")
    body = clean(ev.text, secrets)
    style = KIND_STYLE.get(ev.kind, "")
    head = ev.kind.split()[0]
    if body.startswith(head):  # "preflight ok": the text names its kind
        text.append(head, style)
        text.append(body[len(head):])
    elif re.search(r"\b%s\b" % re.escape(ev.kind), body):  # "rank 3 stalled: ..."
        text.append(body)
    else:
        text.append(ev.kind, style)
        text.append(" " + body)
    if ev.kind in ALERTS:
        text.stylize(ALERTS[ev.kind])
    return text


def checkpoint_text(step: str, events: list[Event], state: RunState) -> Text:
    """A step's saves on every node as one line: ``ckpt 20 ✓ 4 nodes × 1.4 MiB 0.9 s``
    (``…`` while a node has not said its save is complete, ``✗`` and which node when one
    is incomplete)."""
    nodes = sorted({ev.node or "?" for ev in events})
    if step.endswith(" deleted"):
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(clock_text(min(ev.ts or 0.0 for ev in events)) + " ", "dim")
        text.append("ckpt %s" % step, "dim")
        text.append(" on %s" % ("%d nodes" % len(nodes) if len(nodes) > 1 else clean(nodes[0])),
                    "dim")
        return text
    done = {ev.node for ev in events if ev.kind == "checkpoint complete"}
    bad = sorted({ev.node or "?" for ev in events if ev.kind == "checkpoint incomplete"})
    saves = [c for c in state.checkpoints if str(c.step) == step]
    size = max((c.bytes for c in saves if c.bytes is not None), default=None)
    took = max((c.seconds for c in saves if c.seconds is not None), default=None)
    mark, style = ("✗", ALERTS["checkpoint incomplete"]) if bad else \
        ("✓", "green") if done >= set(nodes) else ("…", "yellow")
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(clock_text(min(ev.ts or 0.0 for ev in events)) + " ", "dim")
    text.append("ckpt %s " % step, "green")
    text.append(mark, style)
    text.append(" %s" % ("%d nodes" % len(nodes) if len(nodes) > 1 else clean(nodes[0])))
    if size is not None:
        text.append(" × " if len(nodes) > 1 else " ")
        text.append(human_bytes(size))
    if took is not None:
        text.append(" %.1f s" % took)
    if bad:
        text.append("  incomplete on %s" % " ".join(clean(n) for n in bad))
        text.stylize(style)
    return text


def folded(events: list[Event]) -> list[tuple[str | None, list[Event]]]:
    """The events in order, each checkpoint step's events together where its first one is:
    ``(step, [events])`` for a step, ``(None, [event])`` for any other event."""
    items: list[tuple[str | None, list[Event]]] = []
    steps: dict[str, list[Event]] = {}
    for ev in events:
        step = checkpoint_step(ev)
        if step is None:
            items.append((None, [ev]))
        elif step in steps:
            steps[step].append(ev)
        else:
            steps[step] = [ev]
            items.append((step, steps[step]))
    return items


def item_text(item: tuple[str | None, list[Event]], state: RunState, secrets=()) -> Text:
    step, events = item
    return event_text(events[0], secrets) if step is None else \
        checkpoint_text(step, events, state)


def pinned_text(alerts: list[Event], secrets=()) -> Text | None:
    """What the pane pins under itself: the latest alert, and how many came before it."""
    if not alerts:
        return None
    last = alerts[-1]
    text = Text("⚠ ", ALERTS[last.kind])
    text.append_text(event_text(last, secrets))
    if len(alerts) > 1:
        text.append("  (+%d before)" % (len(alerts) - 1))
    return text
