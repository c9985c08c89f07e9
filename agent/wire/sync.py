"""Code to the hosts, the format both sides share: a manifest, its tree hash, message sizes.

The console (console/launch/sync.py) lists and hashes a folder into a manifest; the agent
(agent/sync/place.py) places it into a workdir. What crosses between them is defined here, and
only here (docs/PROTOCOL.md, the ``sync_*`` ops):

- a manifest entry is ``[path, size, mode, sha256]``: ``path`` relative and ``/``-separated,
  never inside one of SKIP_PARTS; ``mode`` one of MODES (:func:`norm_mode`); ``sha256``
  lower-case hex (SHA_RE);
- the manifest's tree hash is :func:`tree_hash` over its entries;
- a ``session`` is SESSION_RE (the console sends 16 hex digits);
- a plan or put message stays under MAX_MESSAGE encoded, and a put under MAX_PUT_BYTES of file
  bytes.

This module is imported by the console; it must stay standard-library only and run on 3.8.
"""

import hashlib
import re

# One message on the wire, encoded: plan and put messages stay under this.
MAX_MESSAGE = 1 << 20
# File bytes in one put message: base64 makes 4 of every 3, and the rest is JSON framing.
MAX_PUT_BYTES = (MAX_MESSAGE - 64 * 1024) // 4 * 3
SKIP_PARTS = (".git", ".rankdeck")  # path parts never sent, never written
MODES = (0o644, 0o755, 0o600, 0o700)  # a file's mode in a manifest (norm_mode)
SESSION_RE = re.compile(r"^[0-9a-f]{8,64}$")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def tree_hash(entries):
    """sha256 over the sorted ``(path, size, mode, sha256)`` entries of a manifest."""
    h = hashlib.sha256()
    for path, size, mode, sha in sorted(entries, key=lambda e: e[0]):
        h.update(path.encode("utf-8", "surrogateescape"))
        h.update(("\0%d\0%o\0%s\n" % (size, mode, sha)).encode("ascii"))
    return h.hexdigest()


def file_sha256(path):
    """The sha256 (hex) of the file at ``path``, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                return h.hexdigest()
            h.update(block)


def norm_mode(st_mode):
    """What a manifest keeps of a file's mode: executable or not, and owner-only when others
    cannot read it (a 0600 key file stays 0600 on the host, never 0644)."""
    mode = 0o755 if st_mode & 0o111 else 0o644
    return mode if st_mode & 0o004 else mode & 0o700
