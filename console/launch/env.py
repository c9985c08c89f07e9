"""A run's environment across consoles: what its record keeps, and what a restart reads again.

A run's environment is each host's inventory ``env:`` and the launch's ``--env`` values. The
run record (console/records/history.py) keeps the inventory's values that are not secret, so that
`rankdeck restart` from a new shell, or after `attach`, starts a node with the environment it
was launched with. Secret values and ``--env`` values are never written anywhere (an
``--env`` value may be a secret the inventory does not name): the record keeps only their
names (``--env`` ones as ``NAME: "****"``), and a restart reads them again from this shell:

- an inventory secret (a ``${VAR}`` value, or ``secret: true``) by loading the inventory file
  again with this shell's environment;
- a ``--env NAME=...`` from this shell's variable NAME. It is masked in output when the
  inventory marks NAME secret (the value replaced a secret, so it is one).

What cannot be read again is *missing*: the restart is refused, naming the variable and the
fix, before anything is stopped.
"""

from __future__ import annotations

import os
from typing import Mapping

from inventory.loader import load_inventory
from inventory.model import EnvValue, Inventory, InventoryError

HIDDEN = "****"  # how older records (and host records) show a value they do not keep


def secret_names(inventory: Inventory) -> set[str]:
    """Every env name that some host of ``inventory`` holds a secret value for."""
    return {k for h in inventory.hosts for k, v in h.env.items() if v.secret}


def launch_secrets(inventory: Inventory, env: dict[str, str]) -> list[str]:
    """The secrets of a launch with ``--env`` values ``env``: the inventory's, and each
    ``--env`` value for a name the inventory marks secret."""
    secret = secret_names(inventory)
    return sorted(set(inventory.secrets) | {v for k, v in env.items() if k in secret and v})


def spec_env_record(env: dict[str, str], inventory: Inventory) -> tuple[dict, list[str]]:
    """``--env`` values as the run record keeps them: (every name with ``****`` for its
    value, the names the inventory marks secret)."""
    secret = secret_names(inventory)
    return {k: HIDDEN for k in env}, sorted(k for k in env if k in secret)


class Restored:
    """The environment of a recorded run, read back: ``spec_env`` for the LaunchSpec, host
    secrets filled into the inventory's hosts in place, and ``missing``: {node: [why]} for
    every secret that could not be read again (each reason names the variable and the fix)."""

    def __init__(self, spec_env: dict[str, str], missing: dict[str, list[str]],
                 secrets: list[str]):
        self.spec_env = spec_env
        self.missing = missing
        self.secrets = secrets  # every secret value read back, for masking output


def restore(record: dict, inventory: Inventory,
            environ: Mapping[str, str] | None = None) -> Restored:
    """Read a recorded run's environment back (see the module docstring). ``inventory`` is
    the run's hosts as recorded (history.inventory_from_record): secret values there are
    placeholders, replaced here when they can be read again."""
    environ = os.environ if environ is None else environ
    nodes = [h.name for h in inventory.hosts]
    missing: dict[str, list[str]] = {}
    recorded = dict((record.get("spec") or {}).get("env") or {})
    # every --env name as ****, its secret ones named in secret_env (records of one earlier
    # version kept the values that were not secret, and left the secret names out of env)
    hidden = sorted({k for k, v in recorded.items() if v == HIDDEN} |
                    set(record.get("secret_env") or ()))
    # masked: a value for a secret name (with no secret_env, an older record: every one)
    masked = set(record["secret_env"]) if "secret_env" in record else set(hidden)
    spec_env = {k: v for k, v in recorded.items() if k not in hidden}
    secrets = []
    for name in hidden:
        if name in environ:
            spec_env[name] = environ[name]
            if name in masked:
                secrets.append(environ[name])
        else:
            why = ("--env %s is never recorded; export %s in this shell (its value for the "
                   "run) and run the restart again" % (name, name))
            for node in nodes:
                missing.setdefault(node, []).append(why)
    wanted = {h.name: [k for k, v in h.env.items() if v.secret] for h in inventory.hosts}
    if any(wanted.values()):
        fresh, error = _load(record.get("inventory") or "", environ)
        for h in inventory.hosts:
            for key in wanted[h.name]:
                value = _fresh_value(fresh, h.name, key)
                if value is None:
                    why = error or ("the inventory %s no longer sets env %s for %s; put it "
                                    "back and run the restart again"
                                    % (record.get("inventory"), key, h.name))
                    missing.setdefault(h.name, []).append(
                        "secret env %s: %s" % (key, why))
                    del h.env[key]  # a placeholder, never a value to send
                    continue
                h.env[key] = EnvValue(value.value, True, value.parts)
                if value.value:
                    secrets.append(value.value)
    return Restored(spec_env, missing, secrets)


def _load(path: str, environ: Mapping[str, str]) -> tuple[Inventory | None, str | None]:
    """The inventory file loaded again with ``environ``, or (None, why not)."""
    if not path or not os.path.exists(path):
        return None, ("its value comes from the inventory %s, which is not there any more; "
                      "put the file back and run the restart again" % (path or "(none)"))
    try:
        return load_inventory(path, environ), None
    except InventoryError as exc:  # usually: a ${VAR} not exported in this shell
        return None, str(exc)


def _fresh_value(fresh: Inventory | None, node: str, key: str) -> EnvValue | None:
    if fresh is None:
        return None
    try:
        return fresh.host(node).env.get(key)
    except KeyError:
        return None
