"""Paths from the inventory, read on the host the way scp and rsync read a remote path.

The console passes ``workdir``, ``python`` and the run folder as the user wrote them: the
laptop's home, user and filesystem are not the host's. Here, on the host, ``~`` and ``~/x``
become the login user's home, and a relative path is relative to that home (not to the
agent's own folder, where `serve` runs). A ``python`` without a slash is a command name looked
up on PATH, as a shell would.
"""

import os
import shutil

# launcher options whose value is a path rankdeck built from the workdir (torchrun's,
# accelerate's, DeepSpeed's: console/launch/launchers.py)
_PATH_OPTIONS = ("--log-dir", "--log_dir", "--hostfile", "--enable_each_rank_log")


def home():
    return os.path.expanduser("~")


def host_path(path):
    """``path`` as an absolute path on this host (``~`` expanded, relative to the home)."""
    path = os.path.expanduser(path or "~")
    return os.path.normpath(os.path.join(home(), path))


def host_python(python):
    """The interpreter to run: a path expanded like :func:`host_path`; a bare name as is."""
    if not python or "/" not in python:
        return python
    return host_path(python)


def python_exists(python):
    """The interpreter's full path when it exists and can be executed here, else None."""
    if not python:
        return None
    if "/" not in python:
        return shutil.which(python)
    path = host_path(python)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def shell_word(word):
    """One word of a command line with a leading ``~`` expanded, as a login shell would."""
    if word.startswith("~"):
        return os.path.expanduser(word)
    return word


def host_argv(argv):
    """torchrun's command line for this host.

    The interpreter (``argv[0]``) and torchrun's ``--log-dir`` are expanded like
    :func:`host_path`; every other word that starts with ``~`` as a shell would (a script
    given as ``~/proj/train.py``, an argument ``--data ~/data``). Relative words other than
    these stay relative to the working directory, which is where a shell would resolve them.
    """
    if not argv:
        return argv
    out = [host_python(argv[0])]
    after_option = None
    for word in argv[1:]:
        if after_option:
            out.append(host_path(word))
            after_option = None
            continue
        name, eq, value = word.partition("=")
        if name in _PATH_OPTIONS and eq:
            out.append("%s=%s" % (name, host_path(value)))
            continue
        if word in _PATH_OPTIONS:
            after_option = word
        out.append(shell_word(word))
    return out


def host_spec(spec):
    """A run spec with every path rankdeck built from the inventory made absolute here."""
    spec = dict(spec)
    if spec.get("argv"):
        spec["argv"] = host_argv(spec["argv"])
    if spec.get("cwd"):
        spec["cwd"] = host_path(spec["cwd"])
    if spec.get("log_dir"):
        spec["log_dir"] = host_path(spec["log_dir"])
    return spec
