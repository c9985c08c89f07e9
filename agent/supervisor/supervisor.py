"""One per run per node, detached: owns torchrun (starts, kills, reaps and restarts it).

Started by `serve` in a session of its own with the run spec on stdin (secrets stay in this
process's memory and torchrun's environment; they are never written to a file or a command
line). It outlives the SSH connection and the laptop. Its files, in the node's run folder:

- ``state.json``  written atomically on every change: pid, state, launches, exit code, cause,
                  torchrun's phase (agent/torchrun/phase.py);
- ``journal``     every rank's output, metrics, checkpoints and events (agent/host/journal.py);
- ``torchrun.log`` torchrun's own console output; ``torchrun-ranks.log`` its worker-group records; ``torchrun/`` torchrun's ``--log-dir``;
- ``supervisor.log`` this process's own errors.

Signals: SIGTERM stops the node's run (verified kill, see procs.kill_run); SIGUSR1 restarts
torchrun (kill, then start again into the same rendezvous); SIGUSR2 puts a warm spare in (its
torchrun, held before the rendezvous since launch, joins it: agent/surgery/spare_hold.py).
SIGUSR1 and SIGUSR2 are requests only with serve's word in the node's folder first
(agent/node/folder.py ``ask_by_signal``): on a Slurm proctrack/cgroup site a job's
``--signal=USR1@90`` or ``scancel --signal`` reaches this process too, and is ignored.

What torchrun and its workers print is recorded by agent/supervisor/recorder.py (masked, parsed,
journaled); this module owns the journal and the file follower it reads through, and their
lifetime. Each file's global rank comes from torchrun's own record of its worker group
(agent/torchrun/log.py), else from the worker's environment. Paths in the spec are already
absolute here (agent/host/paths.py, in node_ops.py).

The launcher process itself (its launch, verified kill, reaping and the cause of its end) is
agent/supervisor/launcher.py's part of this class; this module holds the run's state, the
main loop and what a signal, a Slurm job's turn or a restart (with a static world's new port,
agent/surgery/static_world.py) makes of it.
"""

import json
import os
import signal
import sys
import time

from ..host import fleet, procs
from ..rules import fleet as fleet_rules
from ..node.fence import FENCE
from ..surgery import static_world
from ..host.stats import TelemetryRecorder
from ..host.journal import JournalWriter
from .judge_link import JudgeLink
from ..rules.mask import Masker
from ..host.pace import SLOW, SLOW_WATCHED, Pace
from .ranksample import RankSampler, period_of
from .recorder import Recorder
from ..surgery.spare_hold import Hold
from ..node.ops import STOP_END
from ..node.folder import take_asked
from ..host.runfiles import read_json, write_json_atomic
from ..slurm.job import JobTurns
from .launcher import LauncherProcess
from ..host.tail import LogFollower
from ..host.watch import open_watch
from ..torchrun.log import RANK_RECORD, TorchrunLog

ORPHAN_GRACE = 3.0
PHASE_POLL = 0.25  # how often torchrun's phase (agent/torchrun/phase.py) is read
IDLE_WATCHED = 1.0  # with inotify, the longest sleep: writes, signals, a child's end wake it


class Supervisor(LauncherProcess):
    def __init__(self, spec):
        self.spec = spec
        self.node_dir = spec["node_dir"]
        self.marker = procs.run_marker(spec["run_id"], spec["node"])
        self.state_path = os.path.join(self.node_dir, "state.json")
        previous = read_json(self.state_path, {}) or {}
        self.state = {
            "run_id": spec["run_id"],
            "node": spec["node"],
            "pid": os.getpid(),
            "starttime": procs.stat(os.getpid()).starttime,
            "state": "starting",
            "launches": previous.get("launches", 0),
            "restarts": previous.get("restarts", 0),
            "torchrun_pid": None,
            "exit_code": None,
            "cause": None,
            "kill": None,
            "started": time.time(),
            "ended": None,
            "max_restarts": spec.get("max_restarts", 0),
            "grace": float(spec.get("grace", 10.0)),  # stop's fallback sweep waits as long
        }
        self.journal = JournalWriter(os.path.join(self.node_dir, "journal"))
        self.log_dir = spec["log_dir"]
        try:  # a restarted node's earlier torchrun starts: its last supervisor journaled them
            earlier = os.listdir(self.log_dir)
        except OSError:
            earlier = []
        env = spec.get("env") or {}
        # the values of the secret names, and each ${VAR} filled into a secret value
        self.secrets = [env[k] for k in spec.get("secret_env") or () if env.get(k)] + \
            [v for v in spec.get("secret_parts") or () if v]
        self.masker = Masker(self.secrets)  # on data records, before the journal
        self.follower = LogFollower(self.log_dir, self._resolve_rank,
                                    first_fid=previous.get("next_fid", 1), ignore=earlier,
                                    watch=open_watch(),  # woken by writes (agent/host/watch.py)
                                    keep_whole=self.masker.safe_cut)  # never in a secret
        self.torchrun = None  # pid
        # the job holding a --slurm run: its end, time limit, requeue (agent/slurm/job.py)
        self.slurm_job = JobTurns.from_env(spec["node"], self.node_dir,
                                           spec.get("slurm_limit"), self.log)
        self.judge_link = None  # agent/supervisor/judge_link.py, once run() starts
        self.telemetry = None  # its GPU errors go into the host's record (note_in_record)
        self.instance_before = set()
        self.requests = []
        self.exiting = []  # old torchruns a restart left exiting (kill, watch_exiting)
        self.closes = None  # the job's torch closes the rendezvous on SIGTERM (closes_rendezvous)
        self.job = (None, None)  # the launcher's python and environment (launch)
        # torchrun, or the launcher the run names in its place (causes and phases say which)
        self.launcher = str(spec.get("launcher") or "torchrun")[:40]
        self.torchrun_log = TorchrunLog(os.path.join(self.node_dir, "torchrun.log"),
                                        os.path.join(self.node_dir, RANK_RECORD), self.launcher)
        # what torchrun and its workers print, masked, parsed and journaled (agent/supervisor/recorder.py)
        self.recorder = Recorder(self.journal, self.follower, self.masker, spec["node"],
                                 spec.get("metrics_regex"), spec.get("cwd") or self.node_dir,
                                 spec.get("checkpoint_dir"), self.current_instance, self.log)

    # -- which rank wrote a file -----------------------------------------------------------
    def _resolve_rank(self, attempt, local_rank):
        """The global rank of a worker's files: torchrun's record first (it outlives a worker
        of milliseconds), its environment second; the worker's pid when it still runs (the
        console matches it to the pids NVML sees on each GPU)."""
        known = self.torchrun_log.rank_of(attempt, local_rank)
        live = procs.worker_rank(os.getpid(), attempt, local_rank)
        if known is not None:
            rank, size = known
            # pid None: not exec'd yet (or gone); the follower asks again a little later
            return rank, {"world_size": size,
                          "pid": live[2] if live is not None and live[0] == rank else None}
        if live is not None:
            return live[0], {"world_size": live[1], "pid": live[2]}
        return None

    # -- state -----------------------------------------------------------------------------
    def save(self, **changes):
        self.state.update(changes)
        self.state["next_fid"] = self.follower.next_fid
        write_json_atomic(self.state_path, self.state)

    def log(self, text):
        sys.stderr.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), text))
        sys.stderr.flush()

    # -- main loop -------------------------------------------------------------------------
    def on_signal(self, signum, _frame):
        self.requests.append(signum)

    def next_request(self):
        """The oldest signal asked of this supervisor, or None. A SIGUSR1 or SIGUSR2 that
        serve (or the judge's link) did not ask for first (agent/node/folder.py
        ``ask_by_signal``) is no request: Slurm's ``--signal=USR1@90`` or ``scancel
        --signal`` reaching every process of a job's steps on a proctrack/cgroup site; it is
        logged and left."""
        while self.requests:
            sig = self.requests.pop(0)
            if sig == signal.SIGTERM or take_asked(self.node_dir, sig):
                return sig
            self.log("%s ignored: not asked by serve (a Slurm --signal or scancel --signal?)"
                     % signal.Signals(sig).name)
        return None

    # -- the run's judge (agent/supervisor/judge_link.py) ---------------------------------------------
    def why_report(self, signals=True):
        """The node's ranks' stacks and flight-recorder tails (agent/torchrun/fr_dump.py), masked;
        ``signals`` False (a read-only watcher's verdict): no signal to the ranks."""
        from ..torchrun.fr_dump import node_report  # only when the judge asks
        return self.masker.mask_tree(node_report(self.node_dir, {"python": sys.executable,
                                                                 "signals": signals}))

    def run(self):
        procs.set_child_subreaper()
        self.judge_link = JudgeLink(self.spec.get("judge") or {}, self.spec["node"],
                                    self.node_dir, self.recorder.files_by_rank, self.why_report,
                                    self.log)
        for sig in (signal.SIGUSR1, signal.SIGUSR2):  # a word left from before asks nothing
            take_asked(self.node_dir, sig)
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, self.on_signal)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        console_log = os.path.join(self.node_dir, "torchrun.log")
        record = os.path.join(self.node_dir, RANK_RECORD)
        for path in (console_log, record):  # made now, so that they can be watched
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        self.follower.add(console_log, stream="torchrun",
                          attempt=None, local_rank=None, instance=None)
        # torchrun's records (its phase: torchrun.log, followed above, and the rank record), a
        # stop or restart and torchrun's end wake the loop. Not the whole node folder: this
        # loop's own journal and state.json writes would wake it for a turn that finds nothing.
        self.follower.wake_on(record, signals=(signal.SIGCHLD,))
        if self.spec.get("hold"):  # a warm spare: held until a cordon puts it in
            ended = Hold(self).wait()
            if ended is not None:
                return ended
        else:
            self.launch()
        self.judge_link.start()  # a held spare joins the judge's view when put in
        grace = self.state["grace"]
        phase_read = 0.0
        telemetry = self.telemetry = TelemetryRecorder(self.journal,
                                                       self.spec.get("cwd") or self.node_dir)
        # ranks' CPU and collective entry times (stragglers, silent ranks)
        ranks_sample = RankSampler(self.journal, self.node_dir, period_of(self.spec.get("env") or {}))
        pace = Pace(slow=SLOW if self.follower.watch is None else SLOW_WATCHED)
        while True:
            read = self.recorder.pump()
            telemetry.tick()
            ranks_sample.tick()
            self.recorder.deleted_checkpoints()
            # with a watch a turn comes of a write or a signal (torchrun's records among them)
            if self.follower.watch is not None or time.monotonic() - phase_read >= PHASE_POLL:
                phase_read = time.monotonic()
                self.save_phase()
            sig = self.next_request()
            if sig is not None:
                if sig == signal.SIGTERM:
                    return self.stop_now()
                if sig == signal.SIGUSR1:
                    self.save(state="restarting")
                    self.recorder.event("restarting")
                    report = self.kill(grace, leave_torchrun=True)
                    self.reap_torchrun()
                    self.recorder.event("killed", report=report)
                    if report["left"]:
                        return self.finish("failed", None, report,
                                           cause={"message": "host needs attention: processes "
                                                  "%s survived SIGKILL" % report["left"]})
                    self.state["restarts"] += 1
                    port = static_world.take_master_port(self.node_dir)
                    if port is not None:  # a static world's restart, on a fresh store
                        self.spec["argv"] = static_world.with_master_port(self.spec["argv"], port)
                    self.launch()
                    continue
            job = self.slurm_job.turn(lambda: self.recorder.checkpoints.complete_at) \
                if self.slurm_job is not None else None
            if job and job[0] == "end":  # its steps are dead; what left their tree is ours
                self.save(state="stopping")
                self.recorder.event("stopping")
                return self.finish("stopped", None, self.kill(grace),
                                   cause={"message": job[1], "slurm": job[2]})
            if job:  # requeued: the ranks end while it waits, start when it runs again
                self.on_requeue(job, grace)
            self.watch_exiting()
            code = self.reap_torchrun()
            if code is not None:
                # every file torchrun made, read to its end: a worker of milliseconds too
                self.recorder.pump(final=True)
                report = procs.kill_run(os.getpid(), self.marker, grace=ORPHAN_GRACE,
                                        on_wait=self.recorder.pump)
                job = self.slurm_job.after_exit() if code and self.slurm_job else None
                if job and job[0] == "end":  # the job's end killed part of the run first
                    return self.finish("stopped", None, report,
                                       cause={"message": job[1], "slurm": job[2]})
                if job:  # its peers ended first: the job was requeued
                    self.on_requeue(job, grace)
                    continue
                if code == 0:
                    return self.finish("exited", 0, report)
                return self.finish("failed", code, report, cause=self.root_cause(code))
            self.follower.wait(pace.after(read),
                               PHASE_POLL if self.follower.watch is None else IDLE_WATCHED)

    def stop_now(self):
        """A stop asked (SIGTERM): the node's run killed and verified, its end recorded."""
        end = self.stop_end()
        self.save(state="stopping")
        self.recorder.event("stopping")
        # a cordon of a hung node kills at once (end["grace"] 0, agent/node/fence.py)
        report = self.kill(self.state["grace"] if end["grace"] is None else end["grace"])
        return self.finish(end["state"], None, report, cause=end["cause"])

    def on_requeue(self, job, grace):
        """``("wait", why)``: end the ranks, the run waits (restarting) for its job to run
        again; ``("resume", why)``: start them again, a restart (agent/slurm/job.py)."""
        kind, why = job
        self.recorder.event("restarting", cause={"message": why})
        if kind == "wait":  # as a restart kills: the run's rendezvous stays open for later
            report = self.kill(grace, leave_torchrun=True)
            self.reap_torchrun()
            # gone, or left exiting (watch_exiting reaps it): no longer the run's torchrun,
            # whose exit a later turn would take for the run's failure
            self.torchrun = None
            self.recorder.event("killed", report=report)
            self.save(state="restarting", cause={"message": why}, torchrun_pid=None)
        else:
            self.state["restarts"] += 1
            self.spec["argv"] = self.slurm_job.rejoin_argv(self.spec["argv"])
            self.launch()

    def save_phase(self):
        """state.json's ``phase``: where torchrun is (rendezvous round, workers running...)."""
        phase = self.torchrun_log.current_phase()
        if phase != self.state.get("phase"):
            self.save(phase=dict(phase))

    def stop_end(self):
        """How this stop ends the node: ``stopped``, or what the console found the node's run
        had come to (a ``stop`` with ``end``, which agent/node/ops.py leaves in STOP_END before
        it signals; agent/rules/judge.py ``ends_due`` says when and why), or ``stopped`` with the reason the
        run's judge stopped it (``--max-wall``, ``--on-nan stop``)."""
        path = os.path.join(self.node_dir, STOP_END)
        end = read_json(path, None)
        try:
            os.unlink(path)
        except OSError:
            pass
        if not isinstance(end, dict) or end.get("state") not in ("exited", "failed", "stopped"):
            return {"state": "stopped", "cause": None, "grace": None}
        grace = end.get("grace")
        grace = float(grace) if isinstance(grace, (int, float)) and 0 <= grace <= 3600 else None
        cause = end.get("cause")
        if isinstance(cause, dict) and isinstance(cause.get("message"), str):
            rank = cause.get("rank")
            cause = {"message": cause["message"][:500],
                     "rank": rank if isinstance(rank, int) else None}
            if cause_named(end["cause"]):  # the verdict named this node (agent/judge/policy.py)
                cause["named"] = True
        else:
            cause = None
        return {"state": end["state"], "cause": cause, "grace": grace}

    def finish(self, state, code, report, cause=None):
        self.recorder.pump(final=True)
        self.recorder.deleted_checkpoints(final=True)
        self.torchrun_log.phase.end(time.time(), state if code is None else "exit %s" % code)
        self.state["phase"] = dict(self.torchrun_log.phase.phase)
        self.recorder.event("ended", state=state, exit_code=code, cause=cause, kill=report)
        self.exiting = []  # the end's kill took any old torchrun too (it carries the marker)
        self.save(state=state, exit_code=code, cause=cause, kill=report, ended=time.time(),
                  torchrun_pid=None, exiting=[])
        if self.judge_link is not None:
            self.judge_link.close()  # the judge hears the end before this process is gone
        self.follower.close()
        self.journal.close()
        self.note_in_record()
        return 0

    def note_in_record(self):
        """This node's end and its incidents in the host's record (agent/host/fleet.py)."""
        try:
            errors = self.telemetry.errors if self.telemetry is not None else ()
            fleet.note_end(self.node_dir, self.spec["run_id"], self.spec["node"],
                           self.state["state"], fleet_rules.node_incidents(
                               self.state["state"], self.state.get("cause"),
                               read_json(os.path.join(self.node_dir, FENCE)), errors,
                               fleet.named_in(self.node_dir)))
        except (OSError, ValueError, TypeError) as exc:  # the run's end stands without it
            self.log("the host's record not written: %s" % exc)


def cause_named(cause):
    return isinstance(cause, dict) and cause.get("named") is True


def main(node_dir):
    """Entry point: read the spec (JSON) from stdin, detach stdio, supervise until the end."""
    os.umask(0o077)  # the run folder's files are the user's alone (docs/SECURITY.md)
    spec = json.loads(sys.stdin.read())
    spec["node_dir"] = node_dir
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    logfd = os.open(os.path.join(node_dir, "supervisor.log"),
                    os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(logfd, 1)
    os.dup2(logfd, 2)
    os.close(logfd)
    sup = Supervisor(spec)
    try:
        return sup.run()
    except Exception:
        import traceback

        traceback.print_exc()
        sup.save(state="failed", cause={"message": "supervisor crashed; see supervisor.log"},
                 ended=time.time())
        procs.kill_run(os.getpid(), sup.marker, grace=sup.state["grace"])
        sup.note_in_record()
        return 1
