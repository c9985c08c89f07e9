"""The run's launcher process (torchrun, or the launcher the run names in its place), as its
node's supervisor holds it: started (with the job's environment, held for a warm spare),
killed and verified (old torchruns a restart leaves exiting included), reaped, and why it
ended (agent/torchrun/cause.py).

:class:`LauncherProcess` is a base of agent/supervisor/supervisor.py ``Supervisor``, whose state it
reads and sets: ``torchrun`` (the pid), ``exiting``, ``state`` (saved through ``save``), the
journal's ``recorder`` and torchrun's own records (``torchrun_log``).
"""

import os
import signal
import time

from ..torchrun import cause, hooks, spare_gate, quirks as torch_quirks
from ..host import procs
from ..host.gpu import GpuProbe
from ..host.gpu_fields import gpu_pids_memory
from ..node.folder import job_env
from ..slurm.job import REQUEST_ENV
from ..host.tail import rank_files
from . import resume_hint
from ..torchrun.log import RANK_RECORD, with_rank_record


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


class LauncherProcess:
    """The launcher's life: a part of ``Supervisor`` (agent/supervisor/supervisor.py)."""

    def launch(self, gate=None):
        """Start torchrun. ``gate``: the read end of a warm spare's pipe (agent/surgery/spare_hold.py):
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
        resume_hint.take(self.node_dir, env)  # --on-loop rollback's word, for this start only
        if self.slurm_job is not None:  # asked to save before the job's time limit
            self.slurm_job.new_run()
            env[REQUEST_ENV] = self.slurm_job.request
        if gate is not None:  # the hook holds this torchrun (agent/torchrun/spare_gate.py)
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
        """Why torchrun ended with ``code`` (agent/torchrun/cause.py): {"message", "rank", ...}."""
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
            # its SIGTERM would close the job's rendezvous (agent/torchrun/quirks.py): SIGKILL
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
        at the first restart: agent/torchrun/quirks.py)."""
        if self.closes is None:
            python, env = self.job
            folder = torch_quirks.torch_dir(python, env) if python else None
            self.closes = torch_quirks.closes_rendezvous_on_stop(folder)
        return self.closes

    def watch_exiting(self):
        """An old torchrun left exiting by a restart: gone is done; past its grace, SIGKILL
        (reaped by ``_reaped``, this process being its parent) and a ``killed`` event
        saying whether that worked. state.json's ``exiting`` lists them: a restart request
        is answered once it is empty (agent/node/ops.py), so that nothing of the old run is left
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


def _reaped(pid, starttime):
    """True once ``pid`` (a child of this process) has ended: reaped here, by ``procs.reap``
    earlier, or not the process that started at ``starttime`` any more."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already
        return True
    return bool(done) or not procs.alive(pid, starttime)
