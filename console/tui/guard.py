"""One bad value shows as ``n/a`` in its cell, never ends the view.

Everything a widget draws comes from a host (untrusted: console/run/messages.py bounds what
it can); a value that still breaks a formatter (a bug, a newer agent's field) must cost one
cell, not the app: Textual ends the app on an exception in ``render``. Each guarded place logs
the first failure of its kind with its traceback to the rankdeck log, not the screen.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger("rankdeck.tui")
NA = "n/a"
_logged: set[str] = set()


def shown_or(fallback):
    """Decorator: the method's result, or ``fallback(self, *args)`` when it raises."""
    def wrap(method):
        @functools.wraps(method)
        def guarded(self, *args):
            try:
                return method(self, *args)
            except Exception as exc:  # noqa: BLE001 - any failure: one cell, not the app
                where = "%s.%s" % (type(self).__name__, method.__name__)
                if where not in _logged:
                    _logged.add(where)
                    log.exception("%s could not show a value (%s): shown as n/a", where,
                                  type(exc).__name__)
                return fallback(self, *args)
        return guarded
    return wrap
