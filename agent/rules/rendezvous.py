"""Which node a rendezvous waits for: each torchrun's phase, and the run's wait, in words.

Every node's supervisor reports its torchrun's phase in ``state.json`` (agent/torchrun/phase.py:
``rendezvous`` round N, ``assigning ranks``, ``workers running``, ``restarting workers``,
``ended``...). When a restart (rankdeck's, or torchrun's own after a failure) has left some
node in a rendezvous for longer than a healthy one takes, the run is *waiting*: this module
says since when, in which round, how many nodes joined it and what every other node's
torchrun is doing (ended, stopped, or still running workers of an older round).

Why a wait needs saying: with a fixed ``--nnodes`` a rendezvous waits for every node until
its join timeout (600 s, torch's default; rankdeck's ``--rdzv-conf`` leaves it), and a node
whose torchrun has ended never joins. Nothing steps and nothing fails for ten minutes.

One rule, two appliers: the run's judge (agent/rules/judge.py, over its RunView of
agent/rules/judge_view.py, in its own clock) and a console with no judge (console/judgement/local_judge.py, over
RunState). Plain functions on node and rank objects, duck-typed: a node has ``name``, ``state``
and ``phase``, a rank ``node`` and ``last_progress``, all times in one clock. Phases come from
a host and are untrusted: :func:`phase_of` keeps only known names and numbers, and cleans the
note.

Standard library only; Python >= 3.9 (the console imports it: tests/unit/test_layers.py).
"""

# A restart measured here brings every rank back in 10-23 s (docs/FACTS.md, "Hangs, kills
# and restarts"), 40 s on a loaded machine; past this the run says what its rendezvous
# waits for.
# Its appliers pass the run's stall threshold (``--stall-after``, 60 s by default) instead.
WAIT_S = 60.0
JOIN_TIMEOUT_S = 600  # torch's c10d default join timeout, which rankdeck leaves as it is

PHASES = ("starting", "rendezvous", "assigning ranks", "starting workers", "workers running",
          "restarting workers", "finished", "stopping", "closed", "ended")
# phases on the way from a (re)start to running workers
IN_RENDEZVOUS = ("starting", "rendezvous", "assigning ranks", "starting workers", "restarting workers")
JOINED = ("assigning ranks", "starting workers")  # past the join, in the phase's round
NOTE_MAX = 120
MOST = 2.0 ** 40  # seconds: past this a time is garbage
ENDED = ("exited", "failed", "stopped", "lost", "unreachable")  # no torchrun to wait for


def phase_of(raw, clean_note=None):
    """A node's phase as a host reported it, reduced to what is shown; None when it is
    missing or not an object. ``clean_note(text, limit)`` cleans the note (the console's
    masks secrets and control characters); by default only printable characters stay."""
    if not isinstance(raw, dict) or raw.get("name") not in PHASES:
        return None
    phase = {"name": raw["name"]}
    for key in ("round", "rank", "world"):
        value = raw.get(key)
        phase[key] = value if isinstance(value, int) and not isinstance(value, bool) else None
    since = raw.get("since")
    phase["since"] = float(since) if isinstance(since, (int, float)) and not isinstance(
        since, bool) and abs(since) < MOST else None  # not NaN nor infinite
    note = raw.get("note")
    clean_note = clean_note or _printable
    phase["note"] = clean_note(note, NOTE_MAX) if isinstance(note, str) and note else None
    return phase


def _printable(text, limit):
    return "".join(c for c in text if c.isprintable())[:limit]


def phase_text(phase):
    """``rendezvous (round 3, waiting)``, ``workers running (round 3)``, ``ended (exit 1)``."""
    if not phase:
        return "unknown"
    parts = []
    if phase.get("round") is not None and phase["name"] not in ("ended", "stopping"):
        parts.append("round %d" % phase["round"])
    if phase["name"] == "assigning ranks" and phase.get("rank") is not None:
        parts.append("node rank %s of %s" % (phase["rank"], phase.get("world")))
    if phase.get("note"):
        parts.append(phase["note"])
    return "%s (%s)" % (phase["name"], ", ".join(parts)) if parts else phase["name"]


def rendezvous_since(node, ranks):
    """When ``node``'s torchrun entered the restart it is in (phase time), or None when it is
    not in one. A rank of the node that stepped after that time means the phase is over
    (the phase arrives by polling, a step may come first)."""
    phase = node.phase
    if not phase or phase["name"] not in IN_RENDEZVOUS or phase.get("since") is None:
        return None
    if node.state in ENDED:
        return None
    since = phase["since"]
    if any((r.last_progress or 0) > since for r in ranks if r.node == node.name):
        return None
    return since


def _joined_round(node, rnd):
    phase = node.phase or {}
    if phase.get("round") != rnd:
        return False
    return phase.get("name") in JOINED or (phase.get("name") == "rendezvous"
                                            and phase.get("note") in ("waiting", "complete"))


def in_flight(nodes, ranks):
    """The rendezvous under way, whatever its age: {"since", "round", "joined", "nodes",
    "in": [names in it], "missing": [{"node", "state", "phase"}]}; None when no node is in one."""
    inside = {name: s for name, s in ((n, rendezvous_since(ns, ranks)) for n, ns in nodes.items())
              if s is not None}
    if not inside:
        return None
    rounds = [nodes[n].phase.get("round") for n in inside if nodes[n].phase.get("round")
              is not None]
    rnd = max(rounds) if rounds else None
    joined = [n for n in nodes if rnd is not None and _joined_round(nodes[n], rnd)]
    missing = [{"node": n, "state": ns.state, "phase": phase_text(ns.phase)}
               for n, ns in nodes.items() if n not in joined]
    return {"since": min(inside.values()), "round": rnd, "joined": len(joined),
            "nodes": len(nodes), "in": sorted(inside), "missing": missing}


def waiting(nodes, ranks, now, wait_s=WAIT_S):
    """The rendezvous the run has waited in for longer than ``wait_s``, with ``text`` saying
    which nodes have not joined and what their torchruns do; None when there is none."""
    flight = in_flight(nodes, ranks)
    if flight is None or now - flight["since"] < wait_s:
        return None
    flight["text"] = wait_text(flight, now)
    return flight


def wait_key(flight):
    """What makes a wait news: its round and the nodes it waits for (said once each)."""
    return flight["round"], tuple(m["node"] for m in flight["missing"])


def wait_text(flight, now):
    """``rendezvous round 3: 2/4 nodes joined in 75 s; not joined: node1 (failed; ended
    (exit 1)), node3 (running; workers running (round 2))``."""
    head = "rendezvous%s: %d/%d nodes joined in %.0f s (torchrun gives up after %d s)" % (
        "" if flight["round"] is None else " round %d" % flight["round"], flight["joined"],
        flight["nodes"], now - flight["since"], JOIN_TIMEOUT_S)
    if not flight["missing"]:
        return head
    return "%s; not joined: %s" % (head, ", ".join(
        "%s (%s; torchrun %s)" % (m["node"], m["state"], m["phase"]) for m in flight["missing"]))


def wait_short(flight, now):
    """``waiting 75 s for node1, node3 (rendezvous round 3: 2/4 joined)``: the status line."""
    return "waiting %.0f s for %s (rendezvous%s: %d/%d joined)" % (
        now - flight["since"], ", ".join(m["node"] for m in flight["missing"]) or "?",
        "" if flight["round"] is None else " round %d" % flight["round"], flight["joined"],
        flight["nodes"])


def restart_refusal(nodes, ranks, targets, now, wait_s=WAIT_S):
    """Why a restart must wait, or None. A node killed while the others are in a rendezvous
    can end the whole run (torch 2.13: the others fail with DistStoreError ``role_info`` or
    RendezvousClosedError; docs/FACTS.md, "Seen in rankdeck's own tests"), so a restart
    waits until the rendezvous completes; once it has waited longer than ``wait_s`` a
    restart is allowed: it is how a node that never joins is brought back. Restarting a node
    that has ended kills nothing: always allowed."""
    if all(nodes[n].state in ENDED for n in targets):
        return None
    flight = in_flight(nodes, ranks)
    if flight is None or now - flight["since"] >= wait_s:
        return None
    return ("restart refused: %s in a rendezvous%s (%d/%d nodes joined, for %.0f s); a node "
            "killed now can end the whole run. Try again once every rank steps, or after %.0f s "
            "if the rendezvous has not completed by then" % (
                ", ".join(flight["in"]), "" if flight["round"] is None else " (round %d)"
                % flight["round"], flight["joined"], flight["nodes"], now - flight["since"],
                wait_s))
