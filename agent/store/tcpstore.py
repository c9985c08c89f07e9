"""The run's rendezvous store: a standalone torch TCPStore process on the rendezvous host.

Every node's torchrun joins the c10d rendezvous with ``is_host=false``, so the store does not
live inside any node's torchrun and a restart of the rendezvous host's node does not take the
whole job down (docs/FACTS.md, "Hangs, kills and restarts": the c10d store lives in the
torchrun of the rendezvous host).
The store runs with the host's training interpreter (it needs torch; the agent does not) as
``python -c STORE_SCRIPT``, which imports this module for :func:`store_main`.

TCPStore has no authentication, and torch 2.13's TCPStore listens on every interface whatever
host name it is given (``*:port``). So the store listens on a socket this module binds to the
rendezvous address alone and hands over (``master_listen_fd``). It also stops itself once the
run has ended on every node (:func:`wait_for_run_end`): a run that ends with no console
attached does not leave an open, unauthenticated port behind (docs/SECURITY.md).

The store binds its socket before it imports torch and says so at once (``store.json``
without ``ready``): a launch asks for that (``early``) and starts the nodes while the store's
torch loads; torchrun's connections wait in the socket's backlog meanwhile. The launch then
waits for ``ready`` (:func:`wait_ready`), so a store that cannot start is still its error.
"""

import os
import signal
import socket
import sys
import time

from ..surgery import expel
from ..slurm import host_step
from ..node import folder as node
from ..host import detach, procs
from ..host.runfiles import log_tail, read_json, write_json_atomic

STORE_SCRIPT = "import sys; from agent.store.tcpstore import store_main; sys.exit(store_main(sys.argv[1:]))"
SETTLE = 15.0  # seconds the run must look ended before the store stops (covers a restart)
WATCH_POLL = 1.0
TCP_ESTABLISHED = "01"


def listen_socket(addr, port):
    """A TCP socket listening on ``addr`` (a name or an IPv4/IPv6 literal) only."""
    family, kind, proto, _name, sockaddr = socket.getaddrinfo(
        addr, port, 0, socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(sockaddr)
    sock.listen(512)
    return sock


def clients(port):
    """Established TCP connections to local ``port`` from other processes (torchrun agents
    keep one open), not counting the store's own client (a master TCPStore has one)."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows += [r.split() for r in f.read().splitlines()[1:]]
        except OSError:
            continue
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            own.add(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    # columns: local address, remote address, state, ..., inode (addresses as HEX:PORT)
    rows = [r for r in rows if r[3] == TCP_ESTABLISHED]
    mine = {_v4(r[1]) for r in rows if "socket:[%s]" % r[9] in own and _port(r[2]) == port}
    return sum(1 for r in rows if _port(r[1]) == port and _v4(r[2]) not in mine)


def _port(hex_addr):
    return int(hex_addr.rsplit(":", 1)[1], 16)


def _v4(hex_addr):
    """An IPv4-mapped IPv6 address (the store's own client uses one) in its IPv4 form."""
    if hex_addr.startswith("0000000000000000FFFF0000"):
        return hex_addr[24:]
    return hex_addr


def nodes_live(run_root):
    """Names of the run's nodes on this host whose supervisor still lives."""
    try:
        names = sorted(os.listdir(run_root))
    except OSError:
        return []
    return [n for n in names
            if (node.node_state(os.path.join(run_root, n)) or {}).get("alive")]


def wait_for_run_end(run_root, port, settle=SETTLE, between=None):
    """Return once, for ``settle`` seconds in a row, no node of the run lives on this host and
    no client is connected to the store: the run has ended on every node (each node's
    torchrun holds a connection while it runs; a node's supervisor lives while it restarts).
    ``between()`` is called every ``expel.POLL`` seconds meanwhile (the expel requests)."""
    quiet_since = None
    while True:
        if nodes_live(run_root) or clients(port):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= settle:
            return
        until = time.monotonic() + WATCH_POLL
        while True:
            if between is not None:
                between()
            left = until - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, expel.POLL))


def master_store(TCPStore, addr, sock):
    """``(store, listens, note)``: the master TCPStore on ``sock``, a socket bound to ``addr``
    alone (closed here), or, where this torch takes no listen fd at all, TCPStore's own socket
    on the same port, with ``note`` saying what address it listens on and why
    (docs/COMPAT.md)."""
    port = sock.getsockname()[1]
    fd = sock.detach()
    handover = dict(is_master=True, wait_for_workers=False, master_listen_fd=fd)
    for backend in ({}, {"use_libuv": False}):
        try:
            return TCPStore(addr, port, **handover, **backend), "%s:%d" % (addr, port), ""
        except NotImplementedError:
            continue  # torch 2.4's libuv store refuses a listen fd; its legacy backend takes it
        except TypeError:  # a torch without master_listen_fd (or use_libuv)
            break
    os.close(fd)
    store = TCPStore(addr, port, is_master=True, wait_for_workers=False)
    listens = "*:%d" % store.port
    return store, listens, ("this torch takes no listen fd: the store listens on %s (every "
                            "address of the host), not on %s alone" % (listens, addr))


def store_main(argv):
    """The store process: ``ADDR PORT INFO_PATH [PYTHON]``; serves until the run has ended.
    Its info file says the port once it is bound, then ``ready`` once TCPStore serves it."""
    procs.ignore_job_signals()  # first: torch's import takes seconds (agent/host/procs.py)
    os.umask(0o077)  # its info files (and the expel answers) owner-only, as serve's own
    addr, port, path = argv[0], int(argv[1]), argv[2]
    sock = listen_socket(addr, port)
    info = {"pid": os.getpid(), "starttime": procs.stat(os.getpid()).starttime, "addr": addr,
            "port": sock.getsockname()[1], "python": (argv[3] if len(argv) > 3 else "") or None}
    write_json_atomic(path, info)  # bound: connections wait in its backlog from now on
    from torch.distributed import TCPStore

    store, listens, note = master_store(TCPStore, addr, sock)
    info.update(listens=listens, ready=True)
    if note:
        info["note"] = note
        log(note)
    write_json_atomic(path, info)
    run_root = os.path.dirname(path)
    # a dead torchrun taken out of the rendezvous when its node's fence asks (agent/surgery/expel.py)
    wait_for_run_end(run_root, store.port,
                     between=lambda: expel.serve_requests(run_root, store, log))
    log("the run has ended on every node: store stopped")
    return 0


def log(text):
    """A line of the store's log (its stderr, ``store.log``), with the time."""
    sys.stderr.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), text))
    sys.stderr.flush()


def store_path(run_root):
    return os.path.join(run_root, "store.json")


def running_store(run_root):
    """The store's info if its process is alive, else None."""
    info = read_json(store_path(run_root))
    if info and procs.alive(info.get("pid", -1), info.get("starttime")):
        return info
    return None


def _ready(info, _proc):
    return bool(info.get("ready"))


def start_store(run_root, addr, python, port=0, timeout=120.0, early=False):
    """Start the store (or take the running one); its info once it serves, or with ``early``
    once its port is bound (then :func:`wait_ready`). Raises RuntimeError with the store's
    log."""
    info = running_store(run_root)
    if info:
        return info if early else wait_ready(run_root, timeout)
    os.makedirs(run_root, exist_ok=True)
    path = store_path(run_root)
    # (on a proctrack/cgroup Slurm site the job's rankdeck-host step starts it:
    # agent/slurm/host_step.py). The Popen is dropped: the store is a session leader of its
    # own; the serve process reaps it only if it ends while serve lives. The store writes
    # its own info (pid, start time, python), owner-only as detach.start leaves it.
    info, _proc = detach.start(
        [python or sys.executable, "-c", STORE_SCRIPT, addr, str(port), path, python or ""],
        path, "the rendezvous store", out=os.path.join(run_root, "store.log"),
        env=node.agent_env(), cwd=run_root, timeout=timeout, spawn=host_step.spawn,
        ready=None if early else _ready)
    return info


def wait_ready(run_root, timeout=120.0):
    """The running store's info once it serves (``ready``). RuntimeError with its log's tail
    when it ended first (or there is none), or after ``timeout`` seconds (it is stopped)."""
    path = store_path(run_root)
    deadline = time.monotonic() + timeout
    while True:
        info = detach.read_info(path)
        if isinstance(info, dict) and info.get("ready"):
            return info
        if not (isinstance(info, dict) and procs.alive(info.get("pid", -1),
                                                       info.get("starttime"))):
            raise RuntimeError("the rendezvous store ended before it served: %s" % (
                log_tail(os.path.join(run_root, "store.log")) or "it wrote no log"))
        if time.monotonic() >= deadline:
            stop_store(run_root)
            raise RuntimeError("the rendezvous store did not serve within %.0f s (stopped; "
                               "its log: %s)" % (timeout, log_tail(
                                   os.path.join(run_root, "store.log"), 500) or "empty"))
        time.sleep(detach.POLL)


def fresh_store(run_root, addr, python, timeout=120.0):
    """Stop the run's store and start a new one on a port of its own choosing: a static
    world's restart (agent/surgery/static_world.py) needs a store with none of the last world's keys.
    ``addr`` and ``python``: None for the last store's. RuntimeError as for
    :func:`start_store`."""
    old = read_json(store_path(run_root)) or {}
    stop_store(run_root)
    return start_store(run_root, addr or old.get("addr"), python or old.get("python"), 0,
                       timeout)


def stop_store(run_root):
    info = read_json(store_path(run_root))
    if not info:
        return {"stopped": False}
    pid, starttime = info.get("pid"), info.get("starttime")
    # each signal through a pidfd (procs.send_signal): the store may end, and its pid go to
    # another process, between a look and a signal
    if pid and procs.send_signal(pid, starttime, signal.SIGTERM):
        deadline = time.monotonic() + 5
        while procs.alive(pid, starttime) and time.monotonic() < deadline:
            procs.reap()
            time.sleep(0.05)
        if procs.send_signal(pid, starttime, signal.SIGKILL):
            time.sleep(0.1)
            procs.reap()
    return {"stopped": True, "pid": pid}
