"""The agent's version: a hash of its own source, so the console and a copied agent agree."""

import hashlib
import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # agent/


def _package(name):
    return name.isidentifier() and name.isascii() and name != "__pycache__"


def source_files(folder=HERE):
    """The agent's ``.py`` files as ``NAME.py`` or ``PACKAGE/NAME.py`` (one level of
    sub-packages, as the zero-install copy takes them: console/transport/agent_copy.py)."""
    names = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(".py"):
            names.append(name)
        elif _package(name) and os.path.isdir(path):
            names.extend(name + "/" + n for n in os.listdir(path) if n.endswith(".py"))
    return sorted(names)


def agent_version(folder=HERE):
    """sha256 over the agent's .py files (name and content), first 16 hex digits."""
    h = hashlib.sha256()
    for name in source_files(folder):
        h.update(name.encode() + b"\0")
        with open(os.path.join(folder, *name.split("/")), "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()[:16]
