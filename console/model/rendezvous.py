"""Which node a rendezvous waits for, on the console's side: agent/rules/rendezvous.py is the rule
(the run's judge applies it too, agent/rules/judge.py); here a host's phase is cleaned with the
console's masker, and the rule's names are what console modules import.
"""

from __future__ import annotations

from agent.rules.rendezvous import phase_of as _phase_of
from agent.rules.rendezvous import (ENDED, IN_RENDEZVOUS, JOIN_TIMEOUT_S, PHASES, WAIT_S, in_flight,
                              phase_text, rendezvous_since, restart_refusal, wait_key,
                              wait_short, wait_text, waiting)

from ..lines.sanitize import NO_SECRETS, Masker, clean
from .nodes import ENDED as ENDED_STATES

__all__ = ["ENDED", "IN_RENDEZVOUS", "JOIN_TIMEOUT_S", "PHASES", "WAIT_S", "in_flight",
           "phase_of", "phase_text", "rendezvous_since", "shown_phase", "restart_refusal", "wait_key",
           "wait_short", "wait_text", "waiting"]


def shown_phase(ns) -> dict | None:
    """A node's phase for its status (docs/STATUS.md), ``text`` added: an ended node's says
    how it ended (``ended (exit 0)``, ``ended (stopped)``) where the last phase its host sent
    is older than its end (DeepSpeed's launcher's ``workers running`` after a success)."""
    phase = ns.phase
    if not phase:
        return None
    if ns.state in ENDED_STATES and phase.get("name") != "ended":
        how = "exit %s" % ns.exit_code if ns.exit_code is not None else ns.state
        if ns.state == "failed" and ns.exit_code is not None:
            how = "failed, " + how
        phase = dict(phase, name="ended", round=None, note=how)
    return dict(phase, text=phase_text(phase))


def phase_of(raw, masker: Masker = NO_SECRETS) -> dict | None:
    """A node's phase as a host reported it (agent/rules/rendezvous.py), its note masked and
    cleaned of control characters; None when it is missing or not an object."""
    return _phase_of(raw, lambda note, limit: clean(note, masker, limit))
