"""Zero-install agent start on a host: copy the agent once per version, then run ``serve``.

The agent's ``.py`` files live on each host in a content-addressed folder,
``<cache>/agent-<version>/agent/``, with a ``.complete`` marker written last. One remote command
does everything (:func:`remote_command`):

- the folder is complete (the usual case): ``cd`` there and ``exec <python> -m agent serve``
  (the agent's own ``__main__`` refuses Pythons older than 3.8 with exit status 4);
- it is not: a small bootstrap run with the host's python checks the version, prints
  :data:`SEND_MARKER` and reads the payload (:meth:`AgentBundle.framed`) from stdin, unpacks it
  into a temporary folder, writes the marker and renames the folder into place (a concurrent
  copy of the same version, or a half-copied folder from an interrupted one, is handled), then
  the same ``exec`` follows.

So a warm host costs one round trip and no payload; a cold one costs one more, to send the
files. Nothing is installed, nothing secret is on a command line.
"""

from __future__ import annotations

import base64
import os
import shlex
import zlib

from agent import version as agent_version_mod

SEND_MARKER = b"rankdeck-send-agent "

# Runs with the host's python before anything else; it must parse on Python 2.7 and 3.x so
# that an old interpreter reports its version instead of a SyntaxError. argv: cache version.
BOOTSTRAP = r'''
import os, sys
v = sys.version_info
if tuple(v[:2]) < (3, 8):
    sys.stderr.write("rankdeck agent needs Python >= 3.8, this is %d.%d (%s)\n"
                     % (v[0], v[1], sys.executable))
    sys.exit(4)
import zlib  # only cheap imports: this runs on every host of a cold launch
root = os.path.expanduser(sys.argv[1])
version = sys.argv[2]
home = os.path.join(root, "agent-" + version)
marker = os.path.join(home, ".complete")

def read_exact(n):
    parts = []
    while n > 0:
        b = os.read(0, min(n, 65536))
        if not b:
            sys.exit("rankdeck: agent payload cut short")
        parts.append(b)
        n -= len(b)
    return b"".join(parts)

def read_line():
    out = b""
    while not out.endswith(b"\n"):
        b = os.read(0, 1)
        if not b:
            sys.exit("rankdeck: agent payload cut short")
        out += b
    return out

def remove(path):
    import shutil
    shutil.rmtree(path, True)

if not os.path.isfile(marker):
    sys.stdout.write("rankdeck-send-agent %s\n" % version)
    sys.stdout.flush()
    raw = zlib.decompress(read_exact(int(read_line())))
    head, body = raw.split(b"\n", 1)
    if not os.path.isdir(root):
        os.makedirs(root, 0o700)
    tmp = os.path.join(root, ".agent-%s.%d.%s" % (version, os.getpid(), os.urandom(4).hex()))
    os.mkdir(tmp, 0o700)
    os.mkdir(os.path.join(tmp, "agent"))
    pos = 0
    for entry in head.decode("ascii").split(";"):
        name, size = entry.rsplit(" ", 1)
        if "/" in name or name.startswith("."):
            sys.exit("rankdeck: bad file name in agent payload: %r" % name)
        with open(os.path.join(tmp, "agent", name), "wb") as f:
            f.write(body[pos:pos + int(size)])
        pos += int(size)
    open(os.path.join(tmp, ".complete"), "w").close()
    for attempt in range(5):
        try:
            os.rename(tmp, home)
            break
        except OSError:
            if os.path.isfile(marker):
                remove(tmp)  # another connection finished the same copy first
                break
            junk = "%s.stale-%d-%d" % (home, os.getpid(), attempt)
            try:
                os.rename(home, junk)  # a half-copied folder: move it aside, then retry
            except OSError:
                pass
            remove(junk)
    else:
        sys.exit("rankdeck: could not install the agent into %s" % home)
'''

# One line, no quotes of its own: survives any login shell (csh does not allow newlines in
# quotes) and still parses on Python 2.7. binascii, not base64: base64 imports re (slow).
BOOTSTRAP_ARG = "import binascii;exec(binascii.a2b_base64('%s'))" % base64.b64encode(
    BOOTSTRAP.encode()).decode()

# The whole remote side, run by ``sh`` whatever the login shell is. $1 cache, $2 version,
# $3 python, $4 bootstrap.
LAUNCH_SCRIPT = (
    'd="$1/agent-$2"; '
    'if [ ! -f "$d/.complete" ]; then "$3" -E -S -c "$4" "$1" "$2" || exit $?; fi; '
    'cd "$d" && PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" && export PYTHONPATH && '
    'exec "$3" -m agent serve'
)


def shell_word(value: str) -> str:
    """Quote for the remote login shell, leaving a leading ``~/`` for it to expand."""
    if value == "~":
        return "~"
    if value.startswith("~/"):
        return "~/" + shlex.quote(value[2:])
    return shlex.quote(value)


class AgentBundle:
    """This console's agent sources, their version and the payload that installs them."""

    def __init__(self, version: str, files: dict[str, bytes]):
        self.version = version
        self.files = files
        names = sorted(files)
        head = ";".join("%s %d" % (n, len(files[n])) for n in names).encode("ascii")
        self.payload = zlib.compress(head + b"\n" + b"".join(files[n] for n in names), 9)

    @classmethod
    def from_local(cls, folder: str | None = None) -> "AgentBundle":
        """Read the agent package next to this console (version and files read consistently)."""
        folder = folder or agent_version_mod.HERE
        for _ in range(5):
            before = agent_version_mod.agent_version(folder)
            files = {}
            for name in agent_version_mod.source_files(folder):
                with open(os.path.join(folder, name), "rb") as f:
                    files[name] = f.read()
            if agent_version_mod.agent_version(folder) == before:
                return cls(before, files)
        raise RuntimeError("the agent's source files keep changing under %s" % folder)

    def framed(self) -> bytes:
        """What the bootstrap reads from stdin: a length line, then the payload."""
        return b"%d\n" % len(self.payload) + self.payload

    def remote_command(self, python: str, cache: str) -> str:
        """One shell command line: check the cache, copy if needed, exec ``serve``."""
        return " ".join([
            "exec sh -c", shlex.quote(LAUNCH_SCRIPT), "rankdeck",
            shell_word(cache.rstrip("/") or "/"), self.version, shell_word(python),
            shlex.quote(BOOTSTRAP_ARG),
        ])
