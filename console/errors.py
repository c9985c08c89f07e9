"""rankdeck's exit codes and the console's error types, at the bottom of every layer.

Exit codes: 0 success (or detached: the run goes on), 1 the run failed or was stopped,
2 bad input or usage, 3 could not reach a host, 130 interrupted before anything ran.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input on the command line: printed as it is, exit 2."""


class UnknownRun(Exception):
    """No run with that id (or prefix) is recorded on this laptop; usually a typo, or the run
    was launched from another laptop (its record lives there)."""


class LaunchError(Exception):
    """Launch refused or failed before the run was running; ``code`` is the exit code and
    ``causes`` maps a host to its failure. Usually means a host is unreachable, failed its
    preflight, or could not start torchrun."""

    def __init__(self, message: str, code: int = EXIT_FAILED, causes: dict | None = None):
        super().__init__(message)
        self.code = code
        self.causes = causes or {}


class AgentError(Exception):
    """A request the agent refused or failed; ``kind`` says what sort (usage, conflict,
    timeout...). ``kind == "closed"`` usually means the connection to the host is gone."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind
