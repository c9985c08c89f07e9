"""Check one parsed inventory document (YAML, TOML, or a caller's defaults) field by field and
build the ``Inventory``; every mistake is an ``InventoryError`` at the line the document
knows for it (``doc.line``), with the value as written (``doc.raw``)."""

from __future__ import annotations

import difflib
import os
from typing import Any, NoReturn

from .addresses import DIGITS, HOST_NAME, addr_problem, is_loopback, listen_address, ssh_host
from .interpolate import ENV_NAME, expand
from .model import LAUNCHERS, EnvValue, Host, Inventory, InventoryError

TOP_KEYS = ("defaults", "hosts", "launcher", "name", "notify", "prometheus", "store",
            "transport")
HOST_KEYS = ("addr", "env", "gpus", "name", "python", "slots", "spare", "ssh", "workdir")
DEFAULT_KEYS = ("env", "gpus", "python", "slots", "sync", "workdir")
ENV_FORM_KEYS = ("secret", "value")
TRANSPORTS = ("ssh", "local")
MAX_SLOTS = 1024  # processes per node; more is a typo (torchrun would start them all)


def _show(value: Any, raw: str | None) -> str:
    """How a wrong value is named in a message: as written where we know it."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return f"{raw or str(value).lower()} (a boolean)"
    if isinstance(value, (int, float)):
        return raw or str(value)
    if value is None:
        return "nothing"
    kind = {list: "a list", dict: "a mapping"}
    return next((k for t, k in kind.items() if isinstance(value, t)), type(value).__name__)


class PlainDoc:
    """Data given by a caller rather than a file: no lines."""

    def line(self, path: tuple) -> None:
        return None

    def raw(self, path: tuple) -> None:
        return None


class Reader:
    """Validates one parsed inventory document and builds the Inventory."""

    def __init__(self, path: str, doc: Any, environ: Mapping[str, str], example: str):
        self.path, self.doc, self.environ, self.example = path, doc, environ, example

    def fail(self, where: tuple, message: str) -> NoReturn:
        raise InventoryError(self.path, self.doc.line(where), message)

    def inventory(self) -> Inventory:
        top = self.doc.data
        if not isinstance(top, dict):
            self.fail((), f"the top level must be a mapping with a hosts list, got "
                          f"{_show(top, None)} (see {self.example})")
        self.check_keys(top, TOP_KEYS, "at the top level", ())
        transport = self.transport(top)
        name = self.text(top, (), "name", "name", default="", empty_ok=True)
        defaults = self.defaults(top.get("defaults"), transport)
        listed = top.get("hosts")
        if not listed:
            self.fail(("hosts",), f"no hosts; add a hosts list with at least one host "
                                  f"(see {self.example})")
        if not isinstance(listed, list):
            self.fail(("hosts",), f"hosts must be a list of hosts, each starting with "
                                  f"'- name:', got {_show(listed, None)}")
        hosts: list[Host] = []
        by_name: dict[str, int] = {}
        by_addr: dict[str, int] = {}
        for i, entry in enumerate(listed):
            host = self.host(i, entry, defaults, transport)
            if host.name in by_name:
                first = self.first(by_name[host.name], "name")
                self.fail(("hosts", i, "name"), f"duplicate host name {host.name!r} (first "
                          f"defined on {first}); host names must be unique")
            if host.addr in by_addr:
                j = by_addr[host.addr]
                where = "addr" if "addr" in entry else "ssh"
                self.fail(("hosts", i, where), f"host {host.name!r} has the same addr "
                          f"{host.addr!r} as host {hosts[j].name!r} ({self.first(j, 'addr')}); "
                          "each node needs its own address (it is the node's --local-addr), "
                          "so give each host a distinct 'addr:'")
            by_name[host.name], by_addr[host.addr] = i, i
            hosts.append(host)
        if all(h.spare for h in hosts):
            self.fail(("hosts", 0, "spare"), "every host is a spare; a run needs at least one "
                      "host without 'spare: true' to train on")
        return Inventory(path=self.path, hosts=hosts, transport=transport, name=name,
                         sync=self.sync_dir(top.get("defaults")),
                         notify=self.text(top, (), "notify", "notify"),
                         prometheus=self.prometheus(top),
                         launcher=self.launcher(top),
                         store=self.store_host(top, by_name))

    def prometheus(self, top: dict) -> str | None:
        """``prometheus: PORT`` or ``ADDR:PORT``: where the run's judge serves metrics."""
        value = top.get("prometheus")
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            self.fail(("prometheus",), "prometheus must be a port or ADDR:PORT (9400, "
                      f"'0.0.0.0:9400'), got {_show(value, self.doc.raw(('prometheus',)))}")
        try:
            listen_address(value)
        except ValueError as exc:
            self.fail(("prometheus",), f"prometheus: {exc}")
        return value.strip()

    def store_host(self, top: dict, by_name: dict) -> str | None:
        """``store: NAME``: the host of the rendezvous store and the judge, one of the hosts."""
        name = self.text(top, (), "store", "store")
        if name is not None and name not in by_name:
            close = difflib.get_close_matches(name, list(by_name), n=1)
            self.fail(("store",), f"store names host {name!r}, which is not in hosts"
                      + (f"; did you mean {close[0]!r}?" if close else
                         f"; name one of: {', '.join(by_name)}"))
        return name

    def flag(self, mapping: dict, path: tuple, key: str, what: str) -> bool:
        """A true/false key (absent: false)."""
        if key not in mapping:
            return False
        value = mapping[key]
        if not isinstance(value, bool):
            self.fail(path + (key,), f"{what} must be true or false, got "
                                     f"{_show(value, self.doc.raw(path + (key,)))}")
        return value

    def first(self, index: int, key: str) -> str:
        line = self.doc.line(("hosts", index, key))
        return f"line {line}" if line else f"host #{index + 1}"

    def check_keys(self, mapping: dict, allowed: tuple, where_text: str, path: tuple) -> None:
        for key in mapping:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"did you mean {close[0]!r}? Allowed" if close else "allowed"
                self.fail(path + (key,), f"unknown key {key!r} {where_text}; "
                                         f"{hint}: {', '.join(allowed)}")

    def transport(self, top: dict) -> str:
        value = self.text(top, (), "transport", "transport", default="ssh")
        if value not in TRANSPORTS:
            close = difflib.get_close_matches(value, TRANSPORTS, n=1)
            self.fail(("transport",), f"transport must be 'ssh' or 'local', got {value!r}"
                      + (f"; did you mean {close[0]!r}?" if close else ""))
        return value

    def launcher(self, top: dict) -> str:
        value = self.text(top, (), "launcher", "launcher", default="torchrun")
        if value not in LAUNCHERS:
            close = difflib.get_close_matches(value, LAUNCHERS, n=1)
            self.fail(("launcher",), f"launcher must be one of {', '.join(LAUNCHERS)}, got "
                      f"{value!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
        return value

    def text(self, mapping: dict, path: tuple, key: str, what: str, default: Any = None,
             empty_ok: bool = False) -> Any:
        """The string at ``mapping[key]``, or ``default`` when the key is absent."""
        if key not in mapping:
            return default
        where, value = path + (key,), mapping[key]
        raw = self.doc.raw(where)
        if value is None and raw == "~":
            value = "~"  # YAML reads a bare `workdir: ~` as null; the user meant home
        if value is None:
            self.fail(where, f"{what} has no value; give it one or remove the line")
        if not isinstance(value, str):
            quote = f"; put it in quotes: \"{raw or value}\"" \
                if isinstance(value, (int, float)) else ""
            self.fail(where, f"{what} must be text, got {_show(value, raw)}{quote}")
        if not value.strip() and not empty_ok:
            self.fail(where, f"{what} is empty; give it a value or remove the line")
        return value

    def whole(self, mapping: dict, path: tuple, key: str, what: str, minimum: int,
              default: int) -> int:
        if key not in mapping:
            return default
        where, value = path + (key,), mapping[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            quoted = isinstance(value, str) and DIGITS.match(value.strip())
            self.fail(where, f"{what} must be a whole number >= {minimum}, got "
                             f"{_show(value, self.doc.raw(where))}"
                             + ("; remove the quotes" if quoted else ""))
        if value > MAX_SLOTS:
            self.fail(where, f"{what} is {value}; more than {MAX_SLOTS} on one node is "
                             "surely a typo (a node's GPU count is e.g. 8)")
        return int(value)

    def defaults(self, raw: dict | None, transport: str) -> dict:
        local = transport == "local"
        base = {"python": "" if local else "python3", "workdir": "." if local else "~",
                "slots": 1, "gpus": 0, "env": {}}
        if raw is None:
            return base
        path = ("defaults",)
        if not isinstance(raw, dict):
            self.fail(path, f"defaults must be a mapping of host keys such as 'slots: 8', got "
                            f"{_show(raw, None)}")
        for key in ("name", "ssh", "addr"):
            if key in raw:
                self.fail(path + (key,), f"{key!r} cannot be a default: every host has its "
                                         "own; set it on each host")
        self.check_keys(raw, DEFAULT_KEYS, "in defaults", path)
        return self.fields(raw, path, "defaults", base, transport, "defaults.env")

    def sync_dir(self, raw: Any) -> str | None:
        """``defaults.sync``: the folder a launch sends, absolute; a relative one is read
        against the inventory file's folder (not where rankdeck happens to be started)."""
        if not isinstance(raw, dict) or "sync" not in raw:
            return None
        value = self.text(raw, ("defaults",), "sync", "defaults: sync")
        folder = os.path.dirname(os.path.abspath(self.path))
        return os.path.normpath(os.path.join(folder, os.path.expanduser(value)))

    def fields(self, raw: dict, path: tuple, label: str, base: dict, transport: str,
               used_by: str) -> dict:
        """The keys a host shares with ``defaults``, over ``base``."""
        return {
            "python": self.text(raw, path, "python", f"{label}: python", base["python"],
                                empty_ok=transport == "local"),
            "workdir": self.text(raw, path, "workdir", f"{label}: workdir", base["workdir"]),
            "slots": self.whole(raw, path, "slots", f"{label}: slots", 1, base["slots"]),
            "gpus": self.whole(raw, path, "gpus", f"{label}: gpus", 0, base["gpus"]),
            "env": {**base["env"], **self.env(raw, path, label, used_by)},
        }

    def host(self, i: int, raw: Any, defaults: dict, transport: str) -> Host:
        path = ("hosts", i)
        if not isinstance(raw, dict):
            self.fail(path, f"host #{i + 1} must be a mapping such as '- name: node{i}', got "
                            f"{_show(raw, None)}")
        name = raw.get("name")
        label = f"host {name!r}" if isinstance(name, str) and name else f"host #{i + 1}"
        if "sync" in raw:
            self.fail(path + ("sync",), f"{label}: sync is one folder for every host; move "
                                        "'sync:' under defaults")
        self.check_keys(raw, HOST_KEYS, f"in {label}", path)
        if "name" not in raw:
            self.fail(path + ("name",), f"{label} has no name; add 'name: <name>' "
                                        "(host names must be unique)")
        name = self.text(raw, path, "name", f"{label}: name")
        if not HOST_NAME.match(name):
            self.fail(path + ("name",), f"host name {name!r} is not valid; use letters, "
                      "digits, '.', '_' and '-', starting with a letter or digit")
        values = self.fields(raw, path, label, defaults, transport, f"hosts.{name}.env")
        ssh, addr = self.reach(raw, path, label, transport, i)
        return Host(name=name, addr=addr, ssh=ssh, line=self.doc.line(path) or 0,
                    spare=self.flag(raw, path, "spare", f"{label}: spare"), **values)

    def reach(self, raw: dict, path: tuple, label: str, transport: str,
              i: int) -> tuple[str | None, str]:
        """The host's ssh target and addr."""
        if transport == "local":
            if "ssh" in raw:
                self.fail(path + ("ssh",), f"{label} sets ssh, but transport is local (every "
                          "node runs on this machine); remove 'ssh:' or set 'transport: ssh'")
            if "addr" not in raw:
                self.fail(path + ("addr",), f"{label} needs an addr with transport local: a "
                          f"loopback address of its own, such as 127.0.0.{i + 2}")
            addr = self.text(raw, path, "addr", f"{label}: addr")
            if not is_loopback(addr):
                self.fail(path + ("addr",), f"{label}: addr {addr!r} is not a loopback "
                          "address; with transport local every node runs on this machine, "
                          "so use 127.0.0.2, 127.0.0.3, ...")
            return None, addr
        ssh = self.text(raw, path, "ssh", f"{label}: ssh", default=raw["name"])
        if ssh.startswith("-"):
            self.fail(path + ("ssh",), f"{label}: ssh {ssh!r} starts with '-', which ssh would "
                      "read as an option; write [user@]host[:port] or an ~/.ssh/config alias")
        host = ssh_host(ssh)
        if host is None:
            self.fail(path + ("ssh",), f"{label}: ssh {ssh!r} is not an ssh target; write an "
                      "~/.ssh/config alias or [user@]host[:port] with a port from 1 to 65535")
        addr = self.text(raw, path, "addr", f"{label}: addr", default=host)
        problem = addr_problem(addr)
        if problem:
            self.fail(path + ("addr",), f"{label}: addr {addr!r} {problem}")
        return ssh, addr

    def env(self, raw: dict, path: tuple, label: str, used_by: str) -> dict[str, EnvValue]:
        block, path = raw.get("env"), path + ("env",)
        if block is None:
            return {}
        if not isinstance(block, dict):
            self.fail(path, f"{label}: env must be a mapping of NAME: value, got "
                            f"{_show(block, None)}")
        out = {}
        for key, value in block.items():
            if not isinstance(key, str) or not ENV_NAME.match(key):
                self.fail(path + (key,), f"{label}: {key!r} is not a valid environment "
                          "variable name; use letters, digits and '_', not starting with a digit")
            out[key] = self.env_value(value, path + (key,), label, key, f"{used_by}.{key}")
        return out

    def env_value(self, value: Any, where: tuple, label: str, key: str,
                  used_by: str) -> EnvValue:
        what, secret = f"{label}: env {key}", None
        if isinstance(value, dict):  # explicit form {value: ..., secret: ...}
            self.check_keys(value, ENV_FORM_KEYS, f"in env {key} of {label}", where)
            if "value" not in value:
                self.fail(where, f"{what} has no 'value:'; write {{value: \"...\", secret: true}}")
            secret = value.get("secret", None)
            if "secret" in value and not isinstance(secret, bool):
                self.fail(where + ("secret",), f"{what}: secret must be true or false, got "
                          f"{_show(secret, self.doc.raw(where + ('secret',)))}")
            where, value = where + ("value",), value["value"]
        raw = self.doc.raw(where)
        if isinstance(value, bool):
            self.fail(where, f"{what} is {_show(value, raw)}; environment values are text, "
                             f"so quote it: \"{raw or str(value).lower()}\"")
        if value is None:
            self.fail(where, f"{what} has no value; write \"\" for an empty value")
        if isinstance(value, (int, float)):
            value = raw or str(value)  # as written: `3.10` stays "3.10", `0700` stays "0700"
        if not isinstance(value, str):
            self.fail(where, f"{what} must be text or a number, got {_show(value, raw)}")
        try:
            text, filled = expand(value, self.environ, used_by)
        except ValueError as err:
            self.fail(where, str(err))
        if "\0" in text:
            self.fail(where, f"{what} contains a NUL character, which no environment variable "
                             "can hold; remove it" + (" (it came from this machine's "
                             "environment)" if filled else ""))
        # what a ${VAR} filled in is a secret of its own (printed alone, without the rest)
        parts = tuple(p for p in filled if p and p != text)
        return EnvValue(text, bool(filled) if secret is None else secret, parts)

