"""The flight-recorder hook: how the agent reads a live rank's flight recorder.

The supervisor copies this file as ``sitecustomize.py`` into ``<node>/frhook/`` and puts that
folder first on the workers' PYTHONPATH (agent/torchrun/hooks.py ``install``), with
``TORCH_FR_BUFFER_SIZE`` set so torch records every collective (gloo too, in torch 2.13).
Python imports ``sitecustomize`` at start-up; in a rank (RANK and LOCAL_RANK in its
environment) it starts one daemon thread that blocks opening a FIFO, ``<fr dir>/<pid>.req``.
The agent opens the FIFO and writes a byte (agent/torchrun/fr_dump.py); the thread asks torch for the
trace (``_dump_fr_trace_json``) and writes ``<pid>.json`` in one rename.

Why a thread on a FIFO rather than a signal: a rank waiting in a collective sits in C++
(gloo's ``wait``), where a Python signal handler never runs until the wait ends; a thread
blocked in ``open`` costs nothing while nobody asks, and runs as soon as someone does
(``wait`` releases the GIL). The FIFO lives in the node's run folder (mode 0700, the run's
user), so only that user can ask.

Set ``RANKDECK_FLIGHT_RECORDER=0`` in the run's env (inventory ``env:``) to leave workers
untouched: no buffer, no thread. Standard library only; torch is read from ``sys.modules`` at
dump time, never imported here.

The same hook, in torchrun's own process, arms the quicker rendezvous poll
(agent/torchrun/rdzv_poll.py, copied beside it) and, in a warm spare's, the gate that holds it before
its rendezvous (agent/torchrun/spare_gate.py). With both switched off (``RANKDECK_RDZV_POLL=0`` as
well) no sitecustomize is put on the path at all.
"""

import json
import os
import sys
import threading

SWITCH = "RANKDECK_FLIGHT_RECORDER"
DIR_VAR = "RANKDECK_FR_DIR"
BUFFER_VAR = "TORCH_FR_BUFFER_SIZE"
# The answer's key for "this torch has no flight recorder": its value is torch's version.
NO_RECORDER = "no_recorder"
# Entries torch keeps per process (a ring). A 4-layer model's step is a few all-reduces;
# 2000 covers hundreds of steps, and an entry is a few hundred bytes.
BUFFER_ENTRIES = "2000"


def enabled(env):
    return env.get(SWITCH, "1") != "0"


# -- in the worker ---------------------------------------------------------------------------
def _trace_json():
    torch = sys.modules.get("torch")
    if torch is None:
        return json.dumps({"error": "torch is not imported in this process"})
    try:
        dump = torch._C._distributed_c10d._dump_fr_trace_json
    except AttributeError:
        # torch 2.4 has none (only NCCL's pickled _dump_nccl_trace, not read here); the verdict
        # is then taken from the stacks alone and says so (agent/rules/verdict.py from_stacks)
        return json.dumps({"error": "this torch has no flight recorder (%s)" % torch.__version__,
                           NO_RECORDER: str(torch.__version__)})
    try:
        data = dump(True, False)  # (includeCollectives, onlyActive) in torch 2.13
    except TypeError:
        data = dump()
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _answer(fr_dir, pid):
    out = os.path.join(fr_dir, "%d.json" % pid)
    tmp = out + ".tmp"
    try:
        text = _trace_json()
    except Exception as exc:  # the dump must never take the rank down
        text = json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)})
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)


def _serve(fr_dir):
    pid = os.getpid()
    req = os.path.join(fr_dir, "%d.req" % pid)
    try:
        if os.path.exists(req):
            os.unlink(req)  # a fifo of an earlier process with this pid
        os.mkfifo(req, 0o600)
    except OSError:
        return
    while True:
        try:
            with open(req, "rb") as f:  # blocks until the agent opens it to write
                f.read()
            _answer(fr_dir, pid)
        except OSError:
            return


def _chain_original():
    """Run the sitecustomize this one hides (Debian's python ships one), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


# -- in torchrun ------------------------------------------------------------------------------
class _AfterImport:
    """On sys.meta_path until ``name`` is imported: loads it as Python would, then calls
    ``then(module)`` right after it ran; ``otherwise()`` when its loader cannot be wrapped."""

    def __init__(self, name, then, otherwise):
        self.name, self.then, self.otherwise = name, then, otherwise

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # asked once
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            if self.otherwise is not None:
                self.otherwise()
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            self.then(module)

        loader.exec_module = exec_module
        return spec


def after_import(name, then, otherwise=None):
    """Have ``then(module)`` change module ``name`` (torch's) as soon as it is imported."""
    sys.meta_path.insert(0, _AfterImport(name, then, otherwise))


def _arm_parts():
    """torchrun's quicker rendezvous poll (agent/torchrun/rdzv_poll.py) and a warm spare's gate
    (agent/torchrun/spare_gate.py), from the copies beside this file; each arms itself only where it
    applies, and a part that is not there leaves torch as it is."""
    for name in ("rankdeck_rdzv_poll", "rankdeck_spare_gate"):
        try:
            part = __import__(name)
        except ImportError:
            continue
        part.arm(after_import)


def _start():
    fr_dir = os.environ.get(DIR_VAR)
    if fr_dir and "RANK" in os.environ and "LOCAL_RANK" in os.environ:
        threading.Thread(target=_serve, args=(fr_dir,), name="rankdeck-fr", daemon=True).start()
    _arm_parts()
    _chain_original()


if __name__ == "sitecustomize":
    _start()
