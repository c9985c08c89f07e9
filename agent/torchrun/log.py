"""What torchrun itself says about its workers: their global ranks, and which one failed first.

A worker that lives for milliseconds is gone before its ``/proc/<pid>/environ`` can be read,
so the rank of its output files is taken from torchrun's own record of the worker group. When
a rendezvous completes, torchrun's agent logs (torch/distributed/elastic/agent/server/api.py,
``_rendezvous``; unchanged since torch 1.9)::

    [default] Rendezvous complete for workers. Result:
      restart_count=0
      ...
      local_ranks=[0, 1]
      global_ranks=[2, 3]
      global_world_sizes=[4, 4]

``restart_count`` is the number in the ``attempt_<n>`` folder of the files. It is logged at
INFO, below the agent logger's default level, so rankdeck starts torchrun through
:data:`BOOTSTRAP`, which lets that one record of that one logger through to a file of its own
(``torchrun-ranks.log``) and shows torchrun's console exactly what it showed before (setting
``LOGLEVEL`` instead would reach every worker's environment, and scripts read it; letting the
logger's INFO lines through filled every node's log pane with torchrun's chatter).
A membership change re-runs the rendezvous with the same ``restart_count`` and possibly other
ranks: the newest record wins, and files are matched to it as soon as they appear.
The same bootstrap records the lines that say where torchrun is (rendezvous round, workers
running, restarting workers), each as ``<created> <message>``: agent/torchrun/phase.py.

When workers fail, torchrun prints the first observed failure at exit::

    Root Cause (first observed failure):
    [0]:
      ...
      rank      : 3 (local_rank: 1)
      exitcode  : 1 (pid: 9892)
"""

import collections
import json
import os
import re
import time

from .phase import RECORDED, PhaseTracker

TORCHRUN_MODULE = "torch.distributed.run"
# `accelerate launch` runs torch's elastic agent in its own process (torch.distributed.run.run):
# the same records, so the same bootstrap (console/launch/launchers.py)
ACCELERATE_MODULE = "accelerate.commands.launch"
ELASTIC_MODULES = (TORCHRUN_MODULE, ACCELERATE_MODULE)
RANK_RECORD = "torchrun-ranks.log"  # in the node's run folder, beside torchrun.log

BOOTSTRAP = "\n".join((
    "import logging, runpy, sys",
    "record = sys.argv.pop(1)",
    "module = sys.argv.pop(1)",
    # accelerate refuses to start node 0 when the main process port is in use on localhost:
    # that port is rankdeck's rendezvous store, there on purpose (is_host=false)
    "if module == %r:" % ACCELERATE_MODULE,
    "    try:",
    "        import accelerate.utils.launch as _acc",
    "        _acc.is_port_in_use = lambda port=None: False",
    "    except Exception:",
    "        pass",
    "try:",
    "    from torch.distributed.elastic.agent.server import api as _api",
    "    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _rdzv",
    "    _kept = %r" % (RECORDED,),
    "    class _Record(logging.Filter):",
    "        def __init__(self, shown):",
    "            logging.Filter.__init__(self)",
    "            self.shown = shown",
    "        def filter(self, rec):",
    "            text = rec.getMessage()",
    "            if any(k in text for k in _kept):",
    "                with open(record, 'a') as f:",
    "                    f.write('%.3f %s\\n' % (rec.created, text))",
    "            return rec.levelno >= self.shown",
    # the agent's phases are INFO, the rendezvous state machine's DEBUG
    "    for _log, _level in ((_api.logger, logging.INFO), (_rdzv.logger, logging.DEBUG)):",
    "        _shown = _log.getEffectiveLevel()",
    "        _log.addFilter(_Record(_shown))",
    "        _log.setLevel(min(_shown, _level))",
    "except Exception:",
    "    pass",
    "runpy.run_module(module, run_name='__main__', alter_sys=True)",
))

_GROUP_START = "Rendezvous complete for workers"
_FAILURE_START = "Root Cause (first observed failure)"
_FIELD = re.compile(r"(?:^|[\s\]])(restart_count|local_ranks|global_ranks|global_world_sizes)"
                    r"=(\S.*?)\s*$")
_RANK = re.compile(r"^\s*rank\s*:\s*(-?\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_SIGNAL = re.compile(r"^\s*traceback\s*:\s*(Signal \d+ \(\w+\))")
READ_SIZE = 1 << 20
KEEP_LINES = 200  # of the current launch, for the cause of a failure


def with_rank_record(argv, record_path):
    """torchrun's (or accelerate's) command line started through :data:`BOOTSTRAP`, its
    worker-group records going to ``record_path`` (any other command line unchanged)."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] in ELASTIC_MODULES:
        return [argv[0], "-c", BOOTSTRAP, record_path, argv[2]] + list(argv[3:])
    return list(argv)


class _Reader:
    """One file read from where it last stopped, with its own place in a multi-line record."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.pending = b""
        self.group = None  # the worker-group record being read
        self.in_failure = False

    def new_lines(self):
        try:  # read every turn of the supervisor: most turns find the same size
            if os.stat(self.path).st_size == self.offset:
                return []
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return []
        lines = []
        try:
            if os.fstat(fd).st_size < self.offset:  # truncated: start again
                self.offset, self.pending = 0, b""
            os.lseek(fd, self.offset, os.SEEK_SET)
            while True:
                chunk = os.read(fd, READ_SIZE)
                if not chunk:
                    break
                self.offset += len(chunk)
                data = self.pending + chunk
                cut = data.rfind(b"\n") + 1
                self.pending = data[cut:]
                lines += data[:cut].decode("utf-8", "replace").splitlines()
        finally:
            os.close(fd)
        return lines


class TorchrunLog:
    """Reads torchrun's console output (``torchrun.log``) and the worker-group records
    :data:`BOOTSTRAP` writes (``record_path``) from where it last stopped.

    :meth:`new_launch` forgets what earlier torchrun processes wrote to the same files.
    """

    def __init__(self, path, record_path=None, launcher="torchrun"):
        self.readers = [_Reader(p) for p in (path, record_path) if p]
        # DeepSpeed's launcher records nothing: its phase is read from its console lines
        self.console_phases = launcher == "deepspeed"
        self.console = self.readers[0]
        self.groups = {}  # restart_count -> {local_rank: (global_rank, world_size)}
        self.failure = None  # {"rank", "local_rank", "exitcode", "signal"} of the last report
        self.recent = collections.deque(maxlen=KEEP_LINES)
        self.phase = PhaseTracker()  # fed the record file's lines (agent/torchrun/phase.py)

    def new_launch(self, now=None):
        self.refresh()
        self.phase.reset(now)
        self.groups = {}
        self.failure = None
        for reader in self.readers:
            reader.group, reader.in_failure = None, False
        self.recent.clear()

    def refresh(self):
        """Read what torchrun wrote since the last call."""
        for reader in self.readers:
            for line in reader.new_lines():
                if reader is self.console:
                    self.recent.append(line)
                    if self.console_phases:
                        self.phase.feed_console(line, time.time())
                else:
                    self.phase.feed(line)
                self._line(reader, line)

    def rank_of(self, attempt, local_rank):
        """``(global_rank, world_size)`` of a worker of restart ``attempt``, or None."""
        self.refresh()
        return self.groups.get(attempt, {}).get(local_rank)

    def current_phase(self):
        """This torchrun's phase (agent/torchrun/phase.py), from what it wrote until now."""
        self.refresh()
        return self.phase.phase

    def first_failure(self):
        """The worker torchrun reported as the first to fail, or None."""
        self.refresh()
        return self.failure

    def recent_text(self):
        """The last lines the current torchrun (or its failed start) wrote."""
        self.refresh()
        return "\n".join(self.recent)

    # -- parsing ---------------------------------------------------------------------------
    def _line(self, reader, line):
        if _GROUP_START in line:
            reader.group = {}
            reader.in_failure = False
            return
        if _FAILURE_START in line:
            self.failure = {"rank": None, "local_rank": None, "exitcode": None, "signal": None}
            reader.in_failure = True
            reader.group = None
            return
        if reader.group is not None:
            m = _FIELD.search(line)
            if m:
                try:
                    reader.group[m.group(1)] = json.loads(m.group(2))
                except ValueError:
                    pass
                if m.group(1) == "global_world_sizes" or len(reader.group) == 4:
                    group, reader.group = reader.group, None
                    self._take_group(group)
            return
        if reader.in_failure:
            m = _RANK.match(line)
            if m:
                self.failure["rank"], self.failure["local_rank"] = int(m.group(1)), int(
                    m.group(2))
                return
            m = _EXIT.match(line)
            if m:
                self.failure["exitcode"] = int(m.group(1))
                return
            m = _SIGNAL.match(line)
            if m:
                self.failure["signal"] = m.group(1)
            elif line.startswith("====="):
                reader.in_failure = False

    def _take_group(self, group):
        try:
            attempt = int(group["restart_count"])
            local, ranks = group["local_ranks"], group["global_ranks"]
            sizes = group.get("global_world_sizes") or [None] * len(ranks)
            self.groups[attempt] = {int(lr): (int(r), s) for lr, r, s in zip(local, ranks, sizes)}
        except (KeyError, TypeError, ValueError):
            pass  # a record this version of rankdeck cannot read: /proc is the other source
