"""Numbers in trainer log lines: the pattern every format uses, and safe conversions.

Standard library only; runs on Python >= 3.8.
"""

import re

# ASCII-only digits: ``\d`` would accept other scripts' digits, which int() also accepts.
# ``[0-9]+(?:\.[0-9]*)?`` rather than ``[0-9]+\.?[0-9]*``: the latter can split a digit run
# in n ways and backtracks quadratically when what follows does not match.
NUM = (r"[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?"
       r"|(?i:nan|inf(?:inity)?))")

#: Fields a metric record may carry besides ``step``. ``samples_s`` (DeepSpeed's
#: CurrSamplesPerSec) and ``tflops`` (Megatron's and torchtitan's per-GPU TFLOP/s) are read
#: only where a trainer prints them.
METRIC_FIELDS = ("step", "loss", "lr", "step_time", "tok_s", "samples_s", "tflops")


def to_float(text):
    """float of ``text``, or None for junk; ``1,234`` (thousands commas) reads as 1234."""
    try:
        return float(text)
    except (TypeError, ValueError):
        pass
    if text and "," in text:
        try:
            return float(text.replace(",", ""))
        except ValueError:
            return None
    return None


INT_MAX = 2 ** 62  # the console refuses whole numbers from here on (console/run/messages.py)


def to_int(text):
    """int of an integer-looking value (``12``, ``12.0``) from 0 to 2**62 - 1; None for a
    negative or larger one, nan, inf or junk (a step of 10**20 is a script's bug, not a step)."""
    if text is None or len(text) > 30:
        # Python >= 3.11 refuses to convert very long digit strings (int_max_str_digits).
        return None
    try:
        value = int(text)
    except ValueError:
        try:
            value = int(float(text))
        except (ValueError, OverflowError):
            return None
    return value if 0 <= value < INT_MAX else None


def convert(field, text):
    """The value of ``field`` read from ``text``: an int step, a float otherwise."""
    return to_int(text) if field == "step" else to_float(text)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text):
    """``text`` without terminal escape sequences (colours, cursor moves)."""
    return _ANSI.sub("", text) if "\x1b" in text else text
