"""A node's fence and a spare's kept start spec (docs/SURGERY.md): a cordoned node is fenced
(``fenced.json``: no start or restart until `uncordon`), stopped and checked; the other nodes'
stalled workers dropped; under ``--auto-cordon`` a spare's start spec waits in its run folder
(``standby.json``) for the run's judge. agent/node/ops.py refuses to start a fenced node.
"""

import json
import os
import signal
import time

from ..surgery import expel
from . import folder as node
from ..host import procs
from ..wire.protocol import RequestError
from ..host.runfiles import read_json, write_json_atomic

FENCE = "fenced.json"  # a cordoned node (docs/SURGERY.md): no start or restart until unfenced
# a spare's start spec under --auto-cordon (docs/SURGERY.md): the run's judge starts the spare
# from it with no console; it holds the run's env, secrets included, so 0600 and removed once
# the spare starts or is fenced
STANDBY = "standby.json"


def refuse_if_fenced(ndir):
    """RequestError ``fenced`` when an operator cordoned this node: nothing of the run may
    start here again (not a restart, not the judge's --on-hang restart) until `uncordon`."""
    fence = read_json(os.path.join(ndir, FENCE))
    if fence is not None:
        raise RequestError("node %s is cordoned (%s); `rankdeck uncordon` makes it a spare "
                           "again" % (os.path.basename(ndir), fence.get("why") or "by an "
                                      "operator"), "fenced")


def fence(args, stop):
    """Cordon the node: fence it first (no start or restart from now on), then ``stop`` it
    (agent/node/ops.py ``stop``, handed in: that module starts nodes, which this one refuses)
    and confirm none of its processes is left, as ``stop`` does, nor GPU memory held by them
    (``gpu``, :func:`gpu_words`). ``fence``: who and why; ``grace``: seconds between SIGTERM
    and SIGKILL (default: the run's --grace; 0 for a node judged hung, which cannot save).
    ``member``: its torchrun in the c10d rendezvous (:func:`expel.member`), or None."""
    ndir = node.node_dir(args)
    os.makedirs(ndir, 0o700, exist_ok=True)
    mark_fenced(ndir, args.get("fence") or {})
    drop_standby(ndir)
    before = node.node_state(ndir)
    if before is None:  # a spare that never ran: fenced, nothing to stop
        return {"state": "missing", "left": [], "fenced": True, "gpu": "nothing ran"}
    # who its torchrun is in the rendezvous, read before the kill: once the stop confirms it
    # dead, the store takes it out on its behalf (agent/surgery/expel.py)
    member = expel.member(before.get("torchrun_pid")) if before["alive"] else None
    done = stop(dict(args, end=fenced_end((args.get("fence") or {}).get("why"),
                                          args.get("grace"), 300)))
    kill = done.get("kill") if isinstance(done.get("kill"), dict) else {}
    # the supervisor's stop checks the GPU (agent/supervisor/launcher.py gpu_after_kill); one
    # that had ended before left its own end's report, which says nothing of now
    gpu = gpu_words(kill.get("gpu")) if before["alive"] else "not checked (its supervisor " \
        "had ended before the fence)"
    return dict(done, fenced=True, gpu=gpu, member=member)


def drop_workers(args):
    """A cordon of a hung node, on another node of the run: its workers, stalled in a
    collective with the hung node's ranks, are SIGKILLed; its torchrun stays and starts them
    again in the rendezvous round the spare joins (a failed worker group, counted against
    --max-restarts as the failure they meet in that collective is). Left alone, they fail
    only once the hung node is gone, and end only after their interpreter's teardown (2-4 s
    on a loaded 2-core host, docs/SURGERY.md). ``killed``: their pids. Refused (``fenced``)
    on a cordoned node; nothing to do on a node whose torchrun is not running."""
    ndir = node.node_dir(args)
    refuse_if_fenced(ndir)
    state = node.node_state(ndir)
    if not state or not state["alive"] or not isinstance(state.get("torchrun_pid"), int):
        return {"killed": []}
    # torchrun's own children that carry the run's marker (only theirs read): a pid
    # state.json names that has gone and been reused has no child of the run
    table = procs.table()
    below = {p: table[p] for p in procs.descendants(state["torchrun_pid"], table)}
    mine = procs.marked(procs.run_marker(state.get("run_id"), state.get("node")), below)
    killed = sorted(p for p in mine if procs.signal_process(table[p], signal.SIGKILL))
    return {"killed": killed}


def mark_fenced(ndir, fence):
    """The node fenced (``fence``: who, why): from now on no start or restart (a console's,
    the judge's) runs it (:func:`refuse_if_fenced`)."""
    write_json_atomic(os.path.join(ndir, FENCE), dict(fence, at=time.time()))


def fenced_end(why, grace, limit):
    """How a fenced node's stop ends it (read by its supervisor, agent/node/ops.py
    STOP_END): ``stopped`` with ``why`` (cut to ``limit``) as its cause; ``grace`` 0 (a node
    judged hung, which cannot save): SIGKILL at once."""
    return {"state": "stopped", "grace": grace,
            "cause": {"message": str(why)[:limit]} if why else None}


def gpu_words(gpu):
    """The GPU check of a node's stop (agent/supervisor/launcher.py ``gpu_after_kill``), in words:
    ``freed``, ``held: N MiB by pid(s) ...`` or ``no GPU`` (no NVML per-process figures on
    the host: no GPU, or nvidia-smi only)."""
    if not isinstance(gpu, dict):
        return "no GPU"
    held = gpu.get("held") if isinstance(gpu.get("held"), int) else 0
    if not held:
        return "freed"
    pids = [p for p in gpu.get("pids") or [] if isinstance(p, int)]
    return "held: %d MiB by pid(s) %s" % (held >> 20, ",".join(str(p) for p in pids))


def standby(args):
    """``launch --auto-cordon``: keep the spare's start ``spec`` in its run folder (0600) so
    the run's judge on this host can start it in a cordoned node's place without a console
    (agent/judge/cordon.py). The login's umask for the job goes with it, as a start's does."""
    ndir = node.node_dir(args)
    refuse_if_fenced(ndir)
    os.makedirs(ndir, 0o700, exist_ok=True)
    spec = dict(args["spec"])
    if node.JOB_UMASK is not None:
        spec["job_umask"] = node.JOB_UMASK
    path = os.path.join(ndir, STANDBY)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    # 0600 from its first byte, whatever this process's umask (the env's secrets are in it)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(spec, f)
    os.replace(tmp, path)
    return {"standby": True}


def drop_standby(ndir):
    """The spare's kept spec goes (it started, or it is fenced): no secret stays on disk."""
    try:
        os.unlink(os.path.join(ndir, STANDBY))
    except OSError:
        pass


def drop_standbys(run_root):
    """Every spare's kept spec under ``run_root`` goes: the run's judge has ended (stopped, or
    found gone when a console stops the run), and with it whoever would start a spare from
    one. A judge that died without its end (SIGKILL, OOM) left them; `rankdeck stop` ends here."""
    try:
        names = os.listdir(run_root)
    except OSError:
        return
    for name in names:
        drop_standby(os.path.join(run_root, name))


def unfence(args):
    """`uncordon`: the node may start again (as a spare); its old run folder stays."""
    path = os.path.join(node.node_dir(args), FENCE)
    was = os.path.exists(path)
    if was:
        os.unlink(path)
    return {"unfenced": was}
