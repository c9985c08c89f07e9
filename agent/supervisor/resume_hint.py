"""What the run's judge asks of a node's next start: ``--on-loop rollback`` resumes its ranks
from the checkpoint before the newest (agent/judge/loops.py; docs/JUDGE.md, "Restart loops").

The judge's ``restart`` with ``resume_before`` (a step, or ``"newest"``) is left in the node's
folder as ``resume.json`` (:func:`leave`); the supervisor's next start of torchrun takes it
(:func:`take`): it becomes ``resume-start.json``, which ``RANKDECK_RESUME_FILE`` names in that
torchrun's environment, and only that one's: a later start without a word of the judge names
none. A trainer reads ``{"before_step": N}`` and resumes from its newest checkpoint of a step
under N (the reference trainer: trainer/checkpoint.py ``resume_before``).

Standard library only; Python >= 3.9.
"""

import os

from ..host.runfiles import read_json, write_json_atomic

ASKED = "resume.json"  # the judge's word, until the next start takes it
TAKEN = "resume-start.json"  # the word of the current start, its trainer's to read
VAR = "RANKDECK_RESUME_FILE"


def leave(node_dir, before):
    """The judge's ``resume_before`` (a whole step or ``"newest"``) for the node's next start;
    anything else leaves no word (ValueError)."""
    if before != "newest" and (not isinstance(before, int) or isinstance(before, bool)
                               or before < 0):
        raise ValueError("resume_before must be a step or \"newest\", not %r" % (before,))
    write_json_atomic(os.path.join(node_dir, ASKED), {"before_step": before})


def take(node_dir, env):
    """At a start of torchrun: the judge's word, if one waits, named in ``env`` for this start
    only; the last start's word is gone either way."""
    taken = os.path.join(node_dir, TAKEN)
    try:
        os.unlink(taken)
    except OSError:
        pass
    asked = os.path.join(node_dir, ASKED)
    word = read_json(asked, None)
    if not isinstance(word, dict) or "before_step" not in word:
        return
    write_json_atomic(taken, {"before_step": word["before_step"]})
    try:
        os.unlink(asked)
    except OSError:
        pass
    env[VAR] = taken
