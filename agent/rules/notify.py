"""Which of the judge's events a notification is for (``--notify-on`` kinds), read the same
on both sides: the judge notifies by them (agent/judge/notify.py), the console checks a
launch's ``--notify-on`` against them."""

KINDS = ("stall", "verdict", "failed", "succeeded", "stopped", "restarted", "diverged", "cordon",
         "loop")
ASKED = "asked by a console"  # a verdict's reason when `w` or `why` asked for it


def kind_of(rec):
    """The notification kind of a judge event, or None."""
    what = rec.get("what")
    if what == "stalled":
        return "stall"
    if what == "run_ended":  # (a Slurm job's cancelled or timeout is a stop, notified so)
        state = {"cancelled": "stopped", "timeout": "stopped"}.get(rec.get("state"),
                                                                   rec.get("state"))
        return state if state in ("failed", "succeeded", "stopped") else None
    if what in ("verdict", "restarted", "diverged"):
        return what
    if what == "cordon proposed":
        return "cordon"
    if what in ("loop", "resume mismatch"):  # a restart loop, and why one happens
        return "loop"
    return None
