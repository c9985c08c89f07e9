"""``${VAR}`` references in inventory env values, filled from the laptop's environment.

``${VAR}`` is the variable (an error when unset), ``${VAR:-fallback}`` the fallback when it is
unset or empty (as in a POSIX shell), ``$${`` a literal ``${``. Any other ``$`` is kept as is:
values reach the rank's environment directly, never through a shell.
"""

from __future__ import annotations

import re
from typing import Mapping

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_REF = re.compile(r"\$\$\{|\$\{([^}]*)(\})?")


def expand(text: str, environ: Mapping[str, str], used_by: str) -> tuple[str, list[str]]:
    """``text`` with its references filled in, and the values filled in from ``environ``
    (empty when nothing came from there; an empty variable is an empty value in it).

    Raises ValueError with a message that names ``used_by`` (e.g. ``hosts.node1.env.KEY``);
    it usually means a variable not exported in this shell.
    """
    filled: list[str] = []

    def fill(match: re.Match) -> str:
        if match.group(0) == "$${":
            return "${"
        if match.group(2) is None:
            raise ValueError(f"unclosed '${{' in {used_by}; close it with '}}', or write '$${{' "
                             "for a literal '${'")
        name, has_default, default = match.group(1).partition(":-")
        if not ENV_NAME.match(name):
            raise ValueError(f"{match.group(0)!r} in {used_by} is not a valid reference; write "
                             "${NAME} or ${NAME:-fallback}, or '$${' for a literal '${'")
        value = environ.get(name)
        if value is None and not has_default:
            raise ValueError(f"environment variable {name} is not set on this machine (used by "
                             f"{used_by}); export it, or write ${{{name}:-default}}")
        if has_default and not value:
            return default
        filled.append(value)
        return value

    return _REF.sub(fill, text), filled
