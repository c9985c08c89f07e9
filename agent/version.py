"""The agent's version: a hash of its own source, so the console and a copied agent agree."""

import hashlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def source_files(folder=HERE):
    return sorted(n for n in os.listdir(folder) if n.endswith(".py"))


def agent_version(folder=HERE):
    """sha256 over the agent's .py files (name and content), first 16 hex digits."""
    h = hashlib.sha256()
    for name in source_files(folder):
        h.update(name.encode() + b"\0")
        with open(os.path.join(folder, name), "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    return h.hexdigest()[:16]
