"""One per run per node, detached: owns torchrun (starts, kills, reaps and restarts it).

Started by `serve` in a session of its own with the run spec on stdin (secrets stay in this
process's memory and torchrun's environment; they are never written to a file or a command
line). It outlives the SSH connection and the laptop. Its files, in the node's run folder:

- ``state.json``  written atomically on every change: pid, state, launches, exit code, cause,
                  torchrun's phase (agent/torchrun_phase.py);
- ``journal``     every rank's output, metrics, checkpoints and events (agent/journal.py);
- ``torchrun.log`` torchrun's own console output; ``torchrun-ranks.log`` its worker-group records; ``torchrun/`` torchrun's ``--log-dir``;
- ``supervisor.log`` this process's own errors.

Signals: SIGTERM stops the node's run (verified kill, see procs.kill_run); SIGUSR1 restarts
torchrun (kill, then start again into the same rendezvous); SIGUSR2 puts a warm spare in (its
torchrun, held before the rendezvous since launch, joins it: agent/spare_hold.py).

What torchrun and its workers print is recorded by agent/recorder.py (masked, parsed,
journaled); this module owns the journal and the file follower it reads through, and their
lifetime. Each file's global rank comes from torchrun's own record of its worker group
(agent/torchrun_log.py), else from the worker's environment; a failure's cause is built by
agent/cause.py. Paths in the spec are already absolute here (agent/hostpaths.py, in node_ops.py).

Over 450 lines: the launch, the kill, the restart (with a static world's new port,
agent/static_world.py) and the cause of an end all act on the same launcher process and its
files; what reads them (records, phases, causes) is in modules of its own already.
"""

import json
import os
import signal
import sys
import time

from . import cause, hooks, procs, spare_gate, static_world, torch_quirks
from .gpu import GpuProbe, gpu_pids_memory
from .hoststats import TelemetryRecorder
from .journal import JournalWriter
from .judge_link import JudgeLink
from .mask import Masker
from .pace import SLOW, SLOW_WATCHED, Pace
from .ranksample import RankSampler, period_of
from .recorder import Recorder
from .spare_hold import Hold
from .node import job_env
from .node_ops import STOP_END
from .runfiles import read_json, write_json_atomic
from .slurm_job import REQUEST_ENV, JobTurns
from .tail import LogFollower, rank_files
from .watch import open_watch
from .torchrun_log import RANK_RECORD, TorchrunLog, with_rank_record

ORPHAN_GRACE = 3.0
PHASE_POLL = 0.25  # how often torchrun's phase (agent/torchrun_phase.py) is read
IDLE_WATCHED = 1.0  # with inotify, the longest sleep: writes, signals, a child's end wake it


def gpu_after_kill(probe, run_pids, wait=5.0):
    """GPU memory the killed processes still hold, per the driver: {"held": bytes, "pids"}.

    The driver frees a dead process's memory a moment after it is reaped, so wait briefly.
    None without NVML per-process figures (no GPU, or nvidia-smi only).
    """
    deadline = time.monotonic() + wait
    while True:
        snap = probe.snapshot()
        if snap.get("source") == "none":
            return None
        held = {pid: used for pid, used in gpu_pids_memory(snap).items() if pid in run_pids}
        if not held or time.monotonic() >= deadline:
            return {"held": sum(held.values()), "pids": sorted(held)}
        time.sleep(0.25)


class Supervisor:
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
                                    watch=open_watch(),  # woken by writes (agent/watch.py)
                                    keep_whole=self.masker.safe_cut)  # never in a secret
        self.torchrun = None  # pid
        # the job holding a --slurm run: its end, time limit, requeue (agent/slurm_job.py)
        self.slurm_job = JobTurns.from_env(spec["node"], self.node_dir,
                                           spec.get("slurm_limit"), self.log)
        self.judge_link = None  # agent/judge_link.py, once run() starts
        self.instance_before = set()
        self.requests = []
        self.exiting = []  # old torchruns a restart left exiting (kill, watch_exiting)
        self.closes = None  # the job's torch closes the rendezvous on SIGTERM (closes_rendezvous)
        self.job = (None, None)  # the launcher's python and environment (launch)
        # torchrun, or the launcher the run names in its place (causes and phases say which)
        self.launcher = str(spec.get("launcher") or "torchrun")[:40]
        self.torchrun_log = TorchrunLog(os.path.join(self.node_dir, "torchrun.log"),
                                        os.path.join(self.node_dir, RANK_RECORD), self.launcher)
        # what torchrun and its workers print, masked, parsed and journaled (agent/recorder.py)
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

    # -- torchrun --------------------------------------------------------------------------
    def launch(self, gate=None):
        """Start torchrun. ``gate``: the read end of a warm spare's pipe (agent/spare_hold.py):
        torchrun is held before its rendezvous until the supervisor writes to it; the node's
        state is ``held`` meanwhile and the launch is counted when it is released."""
        env = job_env()  # the login's PYTHONPATH, without the agent's folder
        env.update(self.spec.get("env", {}))
        env[procs.MARKER] = self.marker
        env["PYTHONUNBUFFERED"] = "1"
        # Without this a node relaunched into a running c10d rendezvous kills the whole job
        # (torch 2.13; docs/FACTS.md, "Hangs, kills and restarts").
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        env["RANKDECK_RUN_ID"] = self.spec["run_id"]
        env["RANKDECK_NODE"] = self.spec["node"]
        env["RANKDECK_NODE_DIR"] = self.node_dir
        env["RANKDECK_LOG_DIR"] = self.log_dir
        env.setdefault("RANKDECK_CKPT_DIR", os.path.join(self.node_dir, "ckpt"))
        if self.slurm_job is not None:  # asked to save before the job's time limit
            self.slurm_job.new_run()
            env[REQUEST_ENV] = self.slurm_job.request
        if gate is not None:  # the hook holds this torchrun (agent/spare_gate.py)
            os.set_inheritable(gate, True)
            env[spare_gate.VAR] = str(gate)
        hooks.install(self.node_dir, env)  # flight-recorder dumps, rendezvous poll (docs/STUCK.md)
        try:
            self.instance_before = set(os.listdir(self.log_dir))
        except OSError:
            self.instance_before = set()
        self.torchrun_log.new_launch(time.time())  # ranks, failures, phase of this torchrun
        out = os.open(os.path.join(self.node_dir, "torchrun.log"),
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        argv = with_rank_record(self.spec["argv"], os.path.join(self.node_dir, RANK_RECORD))
        self.job = (argv[0], env)  # what a restart asks about the job's torch
        pid = os.fork()
        if pid == 0:  # child: torchrun in its own process group, output to the file
            try:
                os.setpgid(0, 0)
                # torchrun and the job write with the login's umask (not 077): their outputs
                # are theirs to share; torchrun's logs stay private inside the 0700 run folder
                os.umask(self.spec.get("job_umask", 0o077))
                os.dup2(devnull, 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.chdir(self.spec.get("cwd") or self.node_dir)
                os.execvpe(argv[0], argv, env)
            except BaseException as exc:
                os.write(2, ("rankdeck: cannot start %s: %s\n" % (argv[0], exc)).encode())
            finally:
                os._exit(127)
        os.close(out)
        os.close(devnull)
        self.torchrun = pid
        if gate is not None:
            os.close(gate)
            self.save(state="held", torchrun_pid=pid, exit_code=None, cause=None,
                      phase=dict(self.torchrun_log.phase.phase))
            self.recorder.event("held", pid=pid, text="warm spare: torchrun loaded, held "
                                "before the rendezvous until a cordon puts this node in")
            return
        launches = self.state["launches"] + 1
        self.save(state="running", torchrun_pid=pid, launches=launches, exit_code=None,
                  cause=None, phase=dict(self.torchrun_log.phase.phase))
        self.recorder.event("launched", pid=pid, launch=launches)

    def current_instance(self):
        try:
            new = sorted(set(os.listdir(self.log_dir)) - self.instance_before)
        except OSError:
            return None
        return new[-1] if new else None

    def root_cause(self, code):
        """Why torchrun ended with ``code`` (agent/cause.py): {"message", "rank", ...}."""
        inst = self.current_instance()
        if inst is None:
            return {"message": cause.torchrun_failed(code, self.torchrun_log.recent_text(),
                                                     False, self.secrets, self.launcher),
                    "rank": None}
        if self.launcher == "deepspeed":  # no error files, no failure record: the rank files
            found = cause.rank_file_failed(self.launch_rank_files(),
                                           self.torchrun_log.recent_text(), self.secrets)
            if found:
                return found
        errors = cause.find_error_files(self.log_dir, inst)
        if errors:
            _ts, local_rank, attempt, text, path = errors[0]
            rank = self.recorder.rank_of(inst, local_rank, attempt)
            first = text.strip().splitlines()[-1] if text.strip() else "worker failed"
            return {"message": cause.one_line(first, self.secrets), "rank": rank,
                    "local_rank": local_rank, "attempt": attempt, "error_file": path}
        failure = self.torchrun_log.first_failure()
        if failure and failure.get("local_rank") is not None:
            fid, attempt = self.recorder.stderr_of(inst, failure["local_rank"])
            text = self.recorder.stderr_tail(fid)
            return {"message": cause.worker_failed(failure, text, self.secrets),
                    "rank": failure.get("rank"), "local_rank": failure["local_rank"],
                    "attempt": attempt, "exit_code": failure.get("exitcode")}
        return {"message": cause.torchrun_failed(code, self.torchrun_log.recent_text(),
                                                 True, self.secrets, self.launcher),
                "rank": None}

    def launch_rank_files(self):
        """{rank: path} of DeepSpeed's per-rank files this launch made."""
        try:
            return rank_files(self.log_dir, set(os.listdir(self.log_dir)) - self.instance_before)
        except OSError:
            return {}

    def kill(self, grace, leave_torchrun=False):
        """The run's verified kill (procs.kill_run). ``leave_torchrun``: return once its
        workers are gone, torchrun still exiting: it is watched from the main loop
        (``watch_exiting``), SIGKILLed past the grace."""
        probe = GpuProbe()
        run_pids = set(procs.run_pids(os.getpid(), self.marker))
        first, killed_first = self.torchrun, None
        if leave_torchrun and first is not None and self.closes_rendezvous():
            # its SIGTERM would close the job's rendezvous (agent/torch_quirks.py): SIGKILL
            # first, its workers then SIGTERMed directly, as a stop does once torchrun is gone
            os.kill(first, signal.SIGKILL)
            killed_first, first, leave_torchrun = first, None, False
        report = procs.kill_run(os.getpid(), self.marker, grace=grace, first=first,
                                on_wait=self.recorder.pump, leave_first=leave_torchrun)
        if killed_first:
            report["torchrun_killed_first"] = killed_first
        self.recorder.pump()
        report["gpu"] = gpu_after_kill(probe, run_pids - {self.torchrun})
        exiting = report.pop("exiting", None)
        if exiting:
            self.exiting.append(exiting)
            report["torchrun_exiting"] = exiting["pid"]
            self.state["exiting"] = [old["pid"] for old in self.exiting]  # saved by launch()
        return report

    def closes_rendezvous(self):
        """Whether the job's torch closes the rendezvous when its torchrun stops (asked once,
        at the first restart: agent/torch_quirks.py)."""
        if self.closes is None:
            python, env = self.job
            folder = torch_quirks.torch_dir(python, env) if python else None
            self.closes = torch_quirks.closes_rendezvous_on_stop(folder)
        return self.closes

    def watch_exiting(self):
        """An old torchrun left exiting by a restart: gone is done; past its grace, SIGKILL
        (reaped by ``_reaped``, this process being its parent) and a ``killed`` event
        saying whether that worked. state.json's ``exiting`` lists them: a restart request
        is answered once it is empty (agent/node_ops.py), so that nothing of the old run is left
        when the console hears the restart is done."""
        before = len(self.exiting)
        self._watch_exiting()
        if len(self.exiting) != before:
            self.save(exiting=[old["pid"] for old in self.exiting])

    def _watch_exiting(self):
        for old in list(self.exiting):
            gone = _reaped(old["pid"], old["starttime"])
            if gone and not old.get("killed"):
                self.exiting.remove(old)
            elif old.get("killed") and (gone or time.monotonic() > old["killed"] + 1):
                self.exiting.remove(old)
                left = [] if gone else [old["pid"]]
                info = None if gone else procs.stat(old["pid"])
                self.recorder.event("killed", report={
                    "sigterm": [old["pid"]], "killed": [old["pid"]], "left": left,
                    "dstate": left if info and info.state == "D" else []})
            elif time.monotonic() > old["deadline"] and not old.get("killed"):
                old["killed"] = time.monotonic()
                try:
                    os.kill(old["pid"], signal.SIGKILL)
                except OSError:
                    pass

    # -- main loop -------------------------------------------------------------------------
    def on_signal(self, signum, _frame):
        self.requests.append(signum)

    # -- the run's judge (agent/judge_link.py) ---------------------------------------------
    def why_report(self):
        """The node's ranks' stacks and flight-recorder tails (agent/fr_dump.py), masked."""
        from .fr_dump import node_report  # only when the judge asks
        return self.masker.mask_tree(node_report(self.node_dir, {"python": sys.executable}))

    def run(self):
        procs.set_child_subreaper()
        self.judge_link = JudgeLink(self.spec.get("judge") or {}, self.spec["node"],
                                    self.node_dir, self.recorder.files_by_rank, self.why_report,
                                    self.log)
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
        telemetry = TelemetryRecorder(self.journal, self.spec.get("cwd") or self.node_dir)
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
            if self.requests:
                sig = self.requests.pop(0)
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
        # a cordon of a hung node kills at once (end["grace"] 0, agent/node_fence.py)
        report = self.kill(self.state["grace"] if end["grace"] is None else end["grace"])
        return self.finish(end["state"], None, report, cause=end["cause"])

    def on_requeue(self, job, grace):
        """``("wait", why)``: end the ranks, the run waits (restarting) for its job to run
        again; ``("resume", why)``: start them again, a restart (agent/slurm_job.py)."""
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

    def reap_torchrun(self):
        """Exit code of torchrun if it has ended (and reap other orphans), else None."""
        if self.torchrun is None:
            return None
        code = None
        for pid, status in procs.reap().items():
            if pid == self.torchrun:
                code = os.waitstatus_to_exitcode(status) if hasattr(
                    os, "waitstatus_to_exitcode") else (status >> 8 if status & 0x7F == 0
                                                        else -(status & 0x7F))
                self.torchrun = None
        return code

    def stop_end(self):
        """How this stop ends the node: ``stopped``, or what the console found the node's run
        had come to (a ``stop`` with ``end``, which agent/node_ops.py leaves in STOP_END before
        it signals; console/finish.py says when and why), or ``stopped`` with the reason the
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
        return 0


def _reaped(pid, starttime):
    """True once ``pid`` (a child of this process) has ended: reaped here, by ``procs.reap``
    earlier, or not the process that started at ``starttime`` any more."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already
        return True
    return bool(done) or not procs.alive(pid, starttime)


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
        return 1
