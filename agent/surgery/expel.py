"""A dead torchrun taken out of the run's c10d rendezvous on its behalf (docs/SURGERY.md).

torch keeps a node in the rendezvous state until its last heartbeat is older than
``keep_alive_interval`` x ``keep_alive_max_attempt`` (1 s x 3 in rankdeck's ``--rdzv-conf``);
a SIGKILLed torchrun never leaves, so the survivors' next round waits that long after a
cordon's fence (torch 2.13, dynamic_rendezvous.py ``_BackendRendezvousStateHolder._sanitize``).
Once a node's torchrun is known dead while the run goes on, the store process sets that
node's ``last_heartbeats`` entry to long past, and the survivors' very next sync removes it as
torch removes any expired node: the same removal, seconds earlier.

Three parts, on two hosts:

- :func:`member`, on the node's host before its torchrun is killed: who that torchrun is in
  the rendezvous (its pid, the address torch names it by: ``--local-addr``, else
  ``socket.getfqdn()``; its ``--rdzv-id``);
- :func:`ask` and :func:`answer`, on the store's host (serve's ``expel``, the judge): a
  request file in the run folder's ``expel/`` for the store process, and its answer;
- :func:`serve_requests`, in the store process (agent/store/tcpstore.py, which has torch): a
  ``compare_set`` on ``torch.rendezvous.<rdzv-id>``, tried again when a survivor wrote first.

Only the entries whose address and pid are the dead torchrun's are touched. Anything else (no
such entry, a state of a shape this torch does not have, a pickle error) changes nothing and
says why: the entry then expires as it would have. Standard library only (the state is
unpickled in the store process, where torch is imported).

The state comes from the store, which any client of it may write: it is unpickled by
:class:`StateUnpickler`, which builds only the rendezvous state's own classes (torch's
``_RendezvousState`` and ``_NodeDesc``, ``datetime`` and its time zones, sets) and refuses
any other global before it is looked up, so a crafted pickle runs nothing in the store
process (docs/SECURITY.md, "The rendezvous store").
"""

import base64
import io
import os
import pickle
import socket
import time
from datetime import datetime

from ..host.runfiles import read_json, write_json_atomic

FOLDER = "expel"  # in the run folder on the store's host
KEY_PREFIX = "torch.rendezvous."  # torch's c10d_rendezvous_backend.py: the key of a run id
GONE = "gone already (expired, or taken out before)"  # the answer's ``gone``
NULL_SENTINEL = b"Y2FuaW1hZGFt"  # its value before any node wrote a state
POLL = 0.1  # seconds between the store's looks for a request
STALE = 60.0  # a request older than this is dropped unread (its asker is long gone)
RACE_TRIES = 20  # compare_set lost to a survivor's write this often: give up
ADDR_MAX, ID_MAX, IDS_MAX = 255, 200, 4
ID_FLAGS = ("--rdzv-id", "--rdzv_id")
ADDR_FLAGS = ("--local-addr", "--local_addr")
BACKEND_FLAGS = ("--rdzv-backend", "--rdzv_backend")
# what a rendezvous state's pickle may name (torch's dynamic_rendezvous.py pickles its
# _RendezvousState with the default protocol): nothing else is looked up, let alone called
STATE_GLOBALS = frozenset((
    ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_RendezvousState"),
    ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_NodeDesc"),
    ("datetime", "datetime"), ("datetime", "timezone"), ("datetime", "timedelta"),
    ("builtins", "set"), ("builtins", "frozenset")))


class StateUnpickler(pickle.Unpickler):
    """An unpickler of a rendezvous state that builds only :data:`STATE_GLOBALS`: a pickle
    naming anything else (``os.system``, a ``__reduce__`` payload) is refused with
    ``pickle.UnpicklingError`` before that name is even imported."""

    def find_class(self, module, name):
        if (module, name) not in STATE_GLOBALS:
            raise pickle.UnpicklingError("the rendezvous state names %s.%s, which a rendezvous "
                                         "state does not hold: not read" % (
                                             str(module)[:80], str(name)[:80]))
        return super().find_class(module, name)


def load_state(data):
    """The rendezvous state pickled in ``data`` (bytes), read by :class:`StateUnpickler`."""
    return StateUnpickler(io.BytesIO(data)).load()


# -- on the node's host ---------------------------------------------------------------------
def member(pid):
    """``{"pid", "addr", "rdzv_ids"}``: torchrun ``pid`` (alive) as the c10d rendezvous names
    it, read from its command line; None when it is gone, is not a c10d torchrun, or names no
    rendezvous id (nothing can be expelled then)."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    rdzv_id = flag(argv, ID_FLAGS)
    if not rdzv_id or flag(argv, BACKEND_FLAGS) != "c10d":
        return None
    return {"pid": pid, "addr": flag(argv, ADDR_FLAGS) or socket.getfqdn(),
            "rdzv_ids": [rdzv_id]}


def flag(argv, names):
    """The value of the first of ``names`` in ``argv`` (``--x v`` or ``--x=v``): torchrun's
    own options come before the script's, so the first is torchrun's."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def checked(req):
    """``req`` (a member, from the wire) with its fields' types and sizes checked; ValueError
    with the reason otherwise."""
    if not isinstance(req, dict):
        raise ValueError("member is not an object")
    pid, addr, ids = req.get("pid"), req.get("addr"), req.get("rdzv_ids")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2 ** 31:
        raise ValueError("member's pid is not a process id: %r" % (pid,))
    if not isinstance(addr, str) or not 0 < len(addr) <= ADDR_MAX:
        raise ValueError("member's addr is not a host address")
    if not isinstance(ids, list) or not 0 < len(ids) <= IDS_MAX or not all(
            isinstance(i, str) and 0 < len(i) <= ID_MAX for i in ids):
        raise ValueError("member's rdzv_ids is not a list of rendezvous ids")
    return {"pid": pid, "addr": addr, "rdzv_ids": list(ids)}


# -- on the store's host: the request and its answer ------------------------------------------
def ask(run_root, req):
    """Leave ``req`` (checked) for the store process; the request's name, for :func:`answer`."""
    folder = os.path.join(run_root, FOLDER)
    os.makedirs(folder, 0o700, exist_ok=True)
    name = "%d-%d-%d" % (time.time() * 1e6, os.getpid(), req["pid"])
    write_json_atomic(os.path.join(folder, name + ".json"), dict(req, at=time.time()))
    return name


def answer(run_root, name, wait):
    """The store's answer to request ``name`` (``expelled``, ``why``), waiting up to ``wait``
    seconds; one saying so when it does not come (usually means the store is busy or gone:
    the entry then expires by itself)."""
    path = os.path.join(run_root, FOLDER, name + ".answer")
    deadline = time.monotonic() + wait
    while True:
        got = read_json(path)
        if isinstance(got, dict):
            os.unlink(path)
            return got
        if time.monotonic() >= deadline:
            return {"expelled": False, "why": "the store did not answer within %.0f s" % wait}
        time.sleep(0.02)


# -- in the store process ----------------------------------------------------------------------
def serve_requests(run_root, store, log):
    """Carry out every request left in the run folder (called every :data:`POLL` seconds):
    each answered, then removed. ``log(text)``: the store's log."""
    folder = os.path.join(run_root, FOLDER)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith((".json", ".answer")))
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(".answer"):  # an asker that gave up waiting
            _drop_if_stale(path)
            continue
        req = read_json(path)
        try:
            os.unlink(path)
        except OSError:
            continue
        at = req.get("at") if isinstance(req, dict) else None
        if not isinstance(at, (int, float)) or time.time() - at > STALE:
            continue  # not a request of ours, or its asker is long gone
        try:
            done = expel(store, checked(req))
        except Exception as exc:  # whatever it is, the store goes on serving
            done = {"expelled": False, "why": "%s: %s" % (type(exc).__name__, exc)}
        log("expel %s pid %s: %s" % (req.get("addr"), req.get("pid"),
                                     "done" if done["expelled"] else done["why"]))
        write_json_atomic(os.path.join(folder, name[:-len(".json")] + ".answer"), done)


def _drop_if_stale(path):
    try:
        if time.time() - os.stat(path).st_mtime > STALE:
            os.unlink(path)
    except OSError:
        pass


def expel(store, req):
    """Set the last heartbeat of ``req``'s entries (its addr and pid) to long past in each of
    its rendezvous ids on ``store`` (a torch TCPStore): ``{"expelled", "why"}``, and ``gone``
    when a rendezvous had no entry of it left (expired first: nothing to wait for)."""
    whys = []
    for rdzv_id in req["rdzv_ids"]:
        why = _expel_one(store, KEY_PREFIX + rdzv_id, req["addr"], req["pid"])
        if why is None:
            return {"expelled": True, "why": "", "rdzv_id": rdzv_id}
        whys.append(why)
    return {"expelled": False, "why": "; ".join(whys), "gone": any(GONE in w for w in whys)}


def _expel_one(store, key, addr, pid):
    """None once done, else why not."""
    # a get of a key that is not there waits for it (the store's timeout): look first
    if not store.check([key]):
        return "no rendezvous %s in the store" % key[len(KEY_PREFIX):]
    for _ in range(RACE_TRIES):
        raw = store.get(key)
        if raw == NULL_SENTINEL:
            return "rendezvous %s has no state yet" % key[len(KEY_PREFIX):]
        try:
            state = load_state(base64.b64decode(raw))
        except (pickle.UnpicklingError, ValueError, EOFError) as exc:  # nothing was changed
            return "the rendezvous state could not be read (%s)" % str(exc)[:300]
        beats = getattr(state, "last_heartbeats", None)
        if type(state).__name__ != "_RendezvousState" or not isinstance(beats, dict):
            return "the rendezvous state is of a shape this code does not know (%s)" % (
                type(state).__name__)
        dead = [n for n in beats if getattr(n, "addr", None) == addr and
                getattr(n, "pid", None) == pid]
        if not dead:
            elsewhere = sorted(str(getattr(n, "addr", "?")) for n in beats
                               if getattr(n, "pid", None) == pid)
            if elsewhere:  # a member named wrongly: a fault of the request, not the run's
                return "no entry for %s pid %d: that pid is in it as %s" % (
                    addr, pid, ", ".join(elsewhere)[:200])
            # its heartbeat expired and a survivor's sync removed it first (a torchrun slow
            # to exit on a loaded host): what the expel was for has happened
            return "no entry for %s pid %d: %s" % (addr, pid, GONE)
        for n in dead:
            if not isinstance(beats[n], datetime):
                return "a heartbeat that is not a time (%s)" % type(beats[n]).__name__
            # long past, in the entry's own kind of time (torch's are timezone-aware)
            beats[n] = datetime(1970, 1, 1, tzinfo=beats[n].tzinfo)
        new = base64.b64encode(pickle.dumps(state))
        # compare_set answers the value now there: ours, or a survivor's newer write
        if store.compare_set(key, raw.decode(), new.decode()) == new:
            return None
    return "lost the race with the survivors' writes %d times" % RACE_TRIES
