"""What a number a host sent must be before a rule counts with it: every figure in a node's
journal, state or answer is untrusted JSON, where ``true`` is an int to Python and ``NaN``
and ``Infinity`` are floats it reads. One place for those predicates, for the rules and the
console (console/run/facts.py, console/run/messages.py).

Plain data, no I/O; standard library only; Python >= 3.9.
"""

from math import isfinite


def integer(value):
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def whole(value, most=None):
    """A whole number from 0 (to ``most``, where given): a count, a step, a pid."""
    return integer(value) and value >= 0 and (most is None or value <= most)


def finite(value):
    """A number that is neither a bool, NaN nor infinite, nor an int too large for a float
    (JSON's 1e400 written out in digits: ``math.isfinite`` raises OverflowError on it, and so
    would any sum with a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return isfinite(value)
    except OverflowError:
        return False
