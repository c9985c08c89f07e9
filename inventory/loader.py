"""Load an inventory (YAML, TOML or a DeepSpeed hostfile) into a validated ``Inventory``.

Every mistake raises ``InventoryError``, whose text is ``file:line: what is wrong and how to
fix it``. YAML lines come from the parser's own nodes (``yaml_lines``). ``tomllib`` keeps no
positions, so TOML lines come from a best-effort scan of the text (``toml_lines``): an error
may point at the enclosing ``[[hosts]]`` table instead of the key, or carry no line.

Only ``env`` values are interpolated (``interpolate``). A value that took anything from the
laptop's environment is secret unless its explicit form says ``secret: false``.

This module reads the file (a regular file of UTF-8 text, at most ``MAX_BYTES``) and the
hostfile's lines; the checks of every field, shared by YAML and TOML, are in ``checks``, and
what a host name, ssh target and addr may be in ``addresses``.
"""

from __future__ import annotations

import codecs
import os
import stat
from typing import Any, Mapping

from . import toml_lines, yaml_lines
from .addresses import DIGITS, HOST_NAME
from .checks import MAX_SLOTS, PlainDoc, Reader
from .model import Host, Inventory, InventoryError

MAX_BYTES = 1 << 20  # an inventory file; a larger one is refused unread


def load_inventory(path: str | os.PathLike, environ: Mapping[str, str] | None = None) -> Inventory:
    """Load the inventory at ``path``: ``.yaml``/``.yml``, ``.toml``, anything else a hostfile.

    ``environ`` is where ``${VAR}`` in env values is looked up (default ``os.environ``).
    Raises InventoryError for every mistake; it usually means a typo or a wrong indent at the
    line it names, or an environment variable not exported in this shell.
    """
    path = os.fspath(path)
    environ = os.environ if environ is None else environ
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".yaml", ".yml"):
        text, parse, example = _read(path), yaml_lines.parse, "inventory/cluster.example.yaml"
    elif suffix == ".toml":
        text, parse, example = _read(path), toml_lines.parse, "inventory/cluster.example.toml"
    else:
        return load_hostfile(path, environ)
    doc = parse(path, text)
    if not text.strip() or doc.data is None:
        raise InventoryError(path, None, f"the file is empty; an inventory needs a list of "
                                         f"hosts (see {example})")
    return Reader(path, doc, environ, example).inventory()


def load_hostfile(path: str | os.PathLike, environ: Mapping[str, str] | None = None,
                  defaults: Mapping[str, Any] | None = None) -> Inventory:
    """Load a DeepSpeed-style hostfile: one ``hostname slots=N`` per line, ``#`` comments.

    Each host's name, ssh target and addr are the hostname; ``slots`` defaults to
    ``defaults["slots"]`` or 1; python, workdir, gpus and env come from ``defaults`` (same keys
    and rules as an inventory's ``defaults:``). Raises InventoryError with the line.
    """
    path = os.fspath(path)
    environ = os.environ if environ is None else environ
    text = _read(path)
    base = Reader(path, PlainDoc(), environ, "").defaults(
        None if defaults is None else dict(defaults), "ssh")
    hosts: list[Host] = []
    first: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        name, slots = fields[0], None
        for field in fields[1:]:
            key, eq, value = field.partition("=")
            if key != "slots" or not eq or slots is not None:
                raise InventoryError(path, number, f"unexpected {field!r} after {name!r}; a "
                                     f"hostfile line is 'hostname slots=N', e.g. 'node0 slots=8'")
            if not DIGITS.match(value) or len(value) > 6 or not 1 <= int(value) <= MAX_SLOTS:
                raise InventoryError(path, number, f"slots must be a whole number from 1 to "
                                     f"{MAX_SLOTS}, got {_short(value)}; write e.g. '{name} slots=8'")
            slots = int(value)
        if not HOST_NAME.match(name):
            raise InventoryError(path, number, f"{name!r} is not a valid host name; use "
                                 "letters, digits, '.', '_' and '-' (for a user or port, use "
                                 "an ~/.ssh/config alias or a YAML inventory)")
        if name in first:
            raise InventoryError(path, number, f"duplicate host name {name!r} (first defined "
                                 f"on line {first[name]}); host names must be unique")
        first[name] = number
        hosts.append(Host(name=name, addr=name, ssh=name, python=base["python"],
                          workdir=base["workdir"], slots=slots or base["slots"],
                          gpus=base["gpus"], env=dict(base["env"]), line=number))
    if not hosts:
        raise InventoryError(path, None, "no hosts in this hostfile; add one line per host, "
                                         "e.g. 'node0 slots=8'")
    return Inventory(path=path, hosts=hosts, transport="ssh")


def _read(path: str) -> str:
    """The text of the inventory file at ``path``: a regular file of at most MAX_BYTES, UTF-8.

    A FIFO, a device (``/dev/zero``) or a huge file is refused before anything is read, and
    a byte that is not UTF-8 is named with its line.
    """
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InventoryError(path, None, "no such file") from None
    except OSError as err:
        raise InventoryError(path, None, f"cannot read: {err.strerror or err}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InventoryError(path, None, "is a directory, not an inventory file")
        if not stat.S_ISREG(mode):
            raise InventoryError(path, None, "is not a regular file (a pipe, socket or "
                                             "device); write the inventory to a file")
        try:
            data = f.read(MAX_BYTES + 1)
        except OSError as err:
            raise InventoryError(path, None, f"cannot read: {err.strerror or err}") from None
    if len(data) > MAX_BYTES:
        raise InventoryError(path, None, f"larger than {MAX_BYTES >> 20} MiB; an inventory "
                                         "lists hosts, so this is probably not one")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise InventoryError(path, line, f"byte 0x{data[err.start]:02x} at column {column} is "
                             "not UTF-8 text; save the file as UTF-8 (or remove that "
                             "character)") from None


def _short(text: str) -> str:
    """``text`` quoted, cut to 40 characters: a message names a value, it does not repeat it."""
    return repr(text) if len(text) <= 40 else repr(text[:37]) + f"... ({len(text)} characters)"

