"""Secret values masked on the host, before a log line enters the run's journal.

The console masks every line as well (console/sanitize.py), but only with the secrets it
knows: a console started in a shell without the run's ``${VAR}`` cannot read them back. So
the supervisor, which holds the run's secret values (from the spec on its stdin), masks data
records before they are written to the journal, and everything served from it (live lines,
scrollback, `logs`, `attach` from any shell) is masked already. Torchrun's own log files on
the host stay as written (the host has the secrets anyway; docs/SECURITY.md).

Same rules as the console: longest first in one pass; a secret shorter than SHORT characters
only where it stands as a whole word. A secret cut in two by a record boundary (only inside
a single line longer than a record, 64 KiB) is left to the console's carried-tail masking.
"""

import re

MASK = b"****"
SHORT = 8


class Masker:
    def __init__(self, secrets=()):
        forms = sorted({s.encode("utf-8", "surrogateescape") for s in secrets if s},
                       key=lambda b: (-len(b), b))
        alternatives = [re.escape(b) if len(b) >= SHORT else
                        rb"(?<!\w)" + re.escape(b) + rb"(?!\w)" for b in forms]
        self.pattern = re.compile(b"|".join(alternatives)) if alternatives else None

    def mask(self, data):
        """``data`` (bytes) with every secret replaced by ``****``."""
        if self.pattern is None or not data:
            return data
        return self.pattern.sub(MASK, data)

    def mask_text(self, text):
        if self.pattern is None or not text:
            return text
        return self.mask(text.encode("utf-8", "surrogateescape")).decode(
            "utf-8", "surrogateescape")
