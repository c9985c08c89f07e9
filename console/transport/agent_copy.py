"""Zero-install agent start on a host: copy the agent once per version, check it, run ``serve``.

The agent's ``.py`` files live on each host in a content-addressed folder,
``<cache>/agent-<version>/agent/``, with a ``.complete`` marker written last. One remote command
runs a small bootstrap with the host's python (:func:`AgentBundle.remote_command`), which:

- checks the version (older than 3.8: exit status 4, with the version on stderr);
- checks the cache folder itself: it must be a real folder (not a symbolic link), owned by the
  login user and writable by nobody else, and every real folder above it owned by root or the
  user and not writable by others unless sticky (as ``/tmp``). Otherwise it refuses with exit
  status 5 and says why and how to fix it: a folder someone else can write is not one to run
  code from (docs/SECURITY.md);
- checks the version folder: only ``.complete`` and ``agent/`` with ``.py`` files, in it or in
  one level of sub-packages (``agent/PACKAGE/NAME.py``, every name a Python identifier: no
  ``..``, no deeper folder), and Python's own ``__pycache__`` beside them; every entry the
  user's, no link, nothing writable by others, and the sha256 of the ``.py`` files equal to the
  version in its name. A folder that fails
  (half-copied, tampered, planted) is moved aside and copied afresh: the bootstrap prints
  :data:`SEND_MARKER`, reads the payload (:meth:`AgentBundle.framed`) from stdin, unpacks it
  into a private temporary folder and renames that into place;
- runs ``agent serve`` from the checked folder in its own interpreter, as ``python -m agent
  serve`` would (with the login's umask, which serve keeps for the job; serve itself writes
  with 077). No second interpreter is started: the bootstrap's runs without site (``-E -S``),
  so the agent imports ``site`` only when it needs site-packages (pynvml, agent/host/gpu_nvml.py).

So a warm host costs one round trip and no payload; a cold one costs one more, to send the
files. Nothing is installed, nothing secret is on a command line.
"""

from __future__ import annotations

import base64
import os
import shlex
import zlib

from agent.wire import version as agent_version_mod

SEND_MARKER = b"rankdeck-send-agent "

# Runs with the host's python before anything else; it must parse on Python 2.7 and 3.x so
# that an old interpreter reports its version instead of a SyntaxError. argv: cache version
# python. Its hash is agent/wire/version.py's agent_version: were they to differ, every warm
# start would copy again (tests/e2e/test_ssh_transport.py, copy_once, would fail).
BOOTSTRAP = r"""
import os, sys
v = sys.version_info
if tuple(v[:2]) < (3, 8):
    sys.stderr.write("rankdeck agent needs Python >= 3.8, this is %d.%d (%s)\n"
                     % (v[0], v[1], sys.executable))
    sys.exit(4)
import hashlib, shutil, stat, zlib  # only cheap imports: this runs on every connection
login_umask = os.umask(0o077)  # the copy is private
root = os.path.expanduser(sys.argv[1])
version = sys.argv[2]
home = os.path.join(root, "agent-" + version)
me = os.geteuid()

def refuse(why, fix):
    sys.stderr.write("rankdeck: refusing the agent cache %s: %s; %s, or give the console "
                     "another cache folder\n" % (root, why, fix))
    sys.exit(5)

def check_root():
    if not os.path.lexists(root):
        os.makedirs(root, 0o700)
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode):
        refuse("it is a symbolic link", "make it a real folder of your own")
    if not stat.S_ISDIR(st.st_mode):
        refuse("it is not a folder", "remove it")
    if st.st_uid != me:
        refuse("it is owned by uid %d, not by you (uid %d)" % (st.st_uid, me),
               "remove it and let rankdeck make it again")
    if st.st_mode & 0o022:
        refuse("other users can write to it (mode %o)" % (st.st_mode & 0o7777),
               "run chmod go-w %s" % root)
    up = os.path.dirname(os.path.realpath(root))
    while True:
        st = os.stat(up)
        if st.st_uid not in (0, me):
            refuse("%s above it is owned by uid %d" % (up, st.st_uid), "move the cache")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            refuse("other users can write to %s above it" % up, "move the cache")
        if up == os.path.dirname(up):
            return
        up = os.path.dirname(up)

WORD = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"

def ident(word):
    # a Python identifier of ASCII letters, digits and _: no "", ".", ".." or "/"
    return word != "" and not word[0].isdigit() and all(c in WORD for c in word)

def package(word):
    return ident(word) and word != "__pycache__"

def source(parts):
    # agent/NAME.py or agent/PACKAGE/NAME.py, one level of sub-packages and no deeper
    return (len(parts) in (2, 3) and parts[0] == "agent" and parts[-1].endswith(".py")
            and ident(parts[-1][:-3]) and all(package(p) for p in parts[1:-1]))

def allowed(rel, st):
    parts = rel.split(os.sep)
    if stat.S_ISDIR(st.st_mode):
        if parts[-1] == "__pycache__":
            parts = parts[:-1]
        return parts == ["agent"] or (len(parts) == 2 and parts[0] == "agent"
                                      and package(parts[1]))
    if not stat.S_ISREG(st.st_mode):
        return False
    if len(parts) == 1:
        return rel == ".complete"
    if len(parts) >= 3 and parts[-2] == "__pycache__":
        return parts[:2] == ["agent", "__pycache__"] and len(parts) == 3 or (
            len(parts) == 4 and parts[0] == "agent" and package(parts[1]))
    return source(parts)

def sources(src):
    # the agent's source files by their names in the payload ("PACKAGE/NAME.py"), sorted as
    # agent/wire/version.py sorts them: its hash is over the same names and bytes
    names = []
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith(".py"):
            names.append(name)
        elif package(name) and os.path.isdir(path):
            names.extend(name + "/" + n for n in os.listdir(path) if n.endswith(".py"))
    return sorted(names)

def problem(folder):
    # why ``folder`` is not a copy of this version to run, or None
    try:
        if not os.path.lexists(folder):
            return "missing"
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return "not a folder"
        if not os.path.isfile(os.path.join(folder, ".complete")):
            return "incomplete"
        entries = [("", os.lstat(folder))]
        for top, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = os.path.join(top, name)
                entries.append((os.path.relpath(path, folder), os.lstat(path)))
        for rel, st in entries:
            if st.st_uid != me or st.st_mode & 0o022 or not (rel == "" or allowed(rel, st)):
                return "unexpected owner, mode or entry at %s" % (rel or ".")
        h = hashlib.sha256()
        src = os.path.join(folder, "agent")
        for name in sources(src):
            h.update(name.encode() + b"\0")
            with open(os.path.join(src, *name.split("/")), "rb") as f:
                h.update(f.read())
            h.update(b"\0")
        if h.hexdigest()[:16] != version:
            return "content does not match its version"
    except OSError as exc:
        return str(exc)
    return None

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

def set_aside(attempt):
    junk = "%s.stale-%d-%d" % (home, os.getpid(), attempt)
    try:
        os.rename(home, junk)
    except OSError:
        return  # gone already (another connection moved it), or never there
    shutil.rmtree(junk, True)

def unpack():
    sys.stdout.write("rankdeck-send-agent %s\n" % version)
    sys.stdout.flush()
    raw = zlib.decompress(read_exact(int(read_line())))
    head, body = raw.split(b"\n", 1)
    tmp = os.path.join(root, ".agent-%s.%d.%s" % (version, os.getpid(), os.urandom(4).hex()))
    os.mkdir(tmp, 0o700)
    os.mkdir(os.path.join(tmp, "agent"), 0o700)
    pos = 0
    for entry in head.decode("ascii").split(";"):
        name, size = entry.rsplit(" ", 1)
        parts = ["agent"] + name.split("/")
        if not source(parts):
            sys.exit("rankdeck: bad file name in agent payload: %r" % name)
        if len(parts) == 3 and not os.path.isdir(os.path.join(tmp, "agent", parts[1])):
            os.mkdir(os.path.join(tmp, "agent", parts[1]), 0o700)
        with open(os.path.join(tmp, *parts), "wb") as f:
            f.write(body[pos:pos + int(size)])
        pos += int(size)
    open(os.path.join(tmp, ".complete"), "w").close()
    return tmp

def install():
    tmp = unpack()
    for attempt in range(5):
        try:
            os.rename(tmp, home)
            return
        except OSError:
            if problem(home) is None:
                shutil.rmtree(tmp, True)  # another connection finished the same copy first
                return
            set_aside(attempt)
    sys.exit("rankdeck: could not install the agent into %s" % home)

check_root()
why = problem(home)
if why is not None:
    if why not in ("missing", "incomplete"):
        sys.stderr.write("rankdeck: copying the agent afresh: %s was %s\n" % (home, why))
    set_aside(9)
    install()
    why = problem(home)
    if why is not None:
        sys.stderr.write("rankdeck: the agent copy in %s is %s\n" % (home, why))
        sys.exit(5)
# made here, private: with the login's umask (002, say) Python makes them group-writable,
# which the check above refuses, and every connection would copy the agent again
for name in [""] + os.listdir(os.path.join(home, "agent")):
    folder = os.path.join(home, "agent", name)
    if name and not (package(name) and os.path.isdir(folder)):
        continue
    try:
        os.mkdir(os.path.join(folder, "__pycache__"), 0o700)
    except OSError:
        pass
os.chdir(home)
os.umask(login_umask)
path = os.environ.get("PYTHONPATH")
os.environ["PYTHONPATH"] = home + (os.pathsep + path if path else "")  # for serve's children
# serve runs in this interpreter: a second one (exec) would cost its start and site's scan of
# site-packages again, ~80 ms of a host's CPU a connection. This one ignored PYTHON* (-E) and
# site (-S): PYTHONPATH is put on sys.path here, site-packages when pynvml is first wanted.
sys.path[:0] = os.environ["PYTHONPATH"].split(os.pathsep)
sys.argv = [os.path.join(home, "agent", "__main__.py"), "serve"]
import runpy
runpy.run_module("agent", run_name="__main__", alter_sys=True)
"""

# One line, no quotes of its own: survives any login shell (csh does not allow newlines in
# quotes) and still parses on Python 2.7. binascii, not base64: base64 imports re (slow).
BOOTSTRAP_ARG = "import binascii;exec(binascii.a2b_base64('%s'))" % base64.b64encode(
    BOOTSTRAP.encode()).decode()

# The whole remote side, run by ``sh`` whatever the login shell is. $1 cache, $2 version,
# $3 python, $4 bootstrap. The bootstrap runs on every connection: it checks the cached copy
# before it runs it (nothing in the cache is trusted because it is there).
LAUNCH_SCRIPT = 'exec "$3" -E -S -c "$4" "$1" "$2" "$3"'


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
                with open(os.path.join(folder, *name.split("/")), "rb") as f:
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
