"""The Slurm job that holds this node's run, watched so the run ends with it, or waits out a
requeue.

A run launched with ``--slurm`` (console/transport/slurm.py) starts its agents as steps of
the job, with ``RANKDECK_SLURM_JOB`` in their environment. When the job ends (``scancel``, its
time limit, a node failure) Slurm kills its steps, but with ``proctrack/linuxproc`` not the
supervisor, torchrun and workers, which left the step's process tree: the supervisor must end
them itself. :class:`JobWatch` asks ``squeue`` every few seconds; an answer it cannot read (no
``squeue`` on the node, the controller away) never ends the run.

With ``--signal-before SECONDS`` (the spec's ``slurm_limit``) :class:`JobTurns` also watches
the time left (``%L``): at SECONDS or less it writes the checkpoint request the ranks read
(``RANKDECK_CHECKPOINT_REQUEST``, trainer/ckpt_request.py), once per time the job runs. With
``--requeue`` the run's first node then asks Slurm to requeue the job (``scontrol requeue``)
once a checkpoint completed after the request (or, with no such checkpoint, at REQUEUE_LATE_S
left); every node's supervisor ends its ranks while the job waits in the queue and starts them
again (a restart, resuming from the last complete checkpoint) once the job runs again with
this node in it.
"""

import os
import shutil
import subprocess
import time

from ..wire.slurm import ALIVE, JUDGE_COMMENT, QUEUED, seconds_left

JOB_ENV = "RANKDECK_SLURM_JOB"
REQUEST_ENV = "RANKDECK_CHECKPOINT_REQUEST"
EVERY_S = 5.0
REQUEUE_LATE_S = 15  # seconds left: requeue now, checkpoint or not (Slurm's KillWait follows)


class JobWatch:
    """``ended()``: None while the job runs (or when it cannot tell), else why the run ends."""

    def __init__(self, job, squeue="squeue", every=EVERY_S):
        self.job = job
        self.squeue = squeue
        self.every = every
        self.last = 0.0

    @classmethod
    def from_env(cls, environ=None):
        """The watch for this process's job, or None outside a Slurm run (or no squeue)."""
        job = (environ if environ is not None else os.environ).get(JOB_ENV, "")
        squeue = shutil.which("squeue")
        if not job or squeue is None:
            return None
        return cls(job, squeue)

    def look(self, now=None, force=False):
        """``(code, out, err)`` of ``squeue -o '%T|%r|%L|%N|%e|%S'``, at most every ``every``
        seconds unless ``force`` (else None); None too when squeue could not run."""
        now = time.monotonic() if now is None else now
        if now - self.last < self.every and not force:
            return None
        self.last = now
        try:
            res = subprocess.run([self.squeue, "-h", "--states=all", "-j", self.job, "-o",
                                  "%T|%r|%L|%N|%e|%S"],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.returncode, res.stdout, res.stderr

    def ended(self, now=None):
        answer = self.look(now)
        return job_end(self.job, *answer) if answer else None


def fields_of(out):
    """``[state, reason, time left, nodes, end time, start time]`` of one squeue answer
    (missing ones empty)."""
    fields = [f.strip() for f in (out.strip().splitlines() or [""])[0].split("|")]
    return (fields + [""] * 6)[:6]


def job_end(job, code, out, err):
    """Why the run ends from one ``squeue -h --states=all -j JOB -o '%T|%r...'`` answer, or
    None (alive, or an answer that says nothing: the controller busy or away)."""
    state, reason = fields_of(out)[:2]
    if (code != 0 and "Invalid job id" in err) or (code == 0 and not state):
        return "Slurm job %s is over (no longer known to Slurm): the run ended with it" % job
    if code != 0 or state in ALIVE:
        return None
    how = {"CANCELLED": "was cancelled (scancel)", "TIMEOUT": "reached its time limit",
           "NODE_FAIL": "lost a node", "PREEMPTED": "was preempted",
           "COMPLETING": "is ending", "COMPLETED": "has ended"}.get(state, "is %s" % state)
    return "Slurm job %s %s%s: the run ended with it" % (
        job, how, " (%s)" % reason if reason and reason != "None" else "")


class JobTurns:
    """What the job asks of this node's supervisor now, one squeue answer at a time:
    ``turn()`` is None, ``("end", why, job state)``, ``("wait", why)`` (requeued: end the
    ranks, keep the run) or ``("resume", why)`` (running again: start the ranks again)."""

    def __init__(self, watch, node, node_dir, limit=None, scontrol="scontrol", log=None):
        self.watch = watch
        self.node = node
        self.request = os.path.join(node_dir, "checkpoint-request")
        limit = limit or {}
        self.before = limit.get("signal_before")
        self.requeue = bool(limit.get("requeue"))
        self.requeuer = bool(limit.get("requeuer"))  # the run's first node asks Slurm
        self.scontrol = scontrol
        self.asked_at = None  # when this node wrote its request (time.time())
        self.requeue_asked = False  # this node ran scontrol requeue
        self.waiting = False  # the job is back in the queue: the ranks were ended
        self.round = ""  # the job's end time (digits) since it runs again after a requeue
        self.started = ""  # when the job's run this node is part of started (squeue %S)
        self.log = log  # the supervisor's log, for scontrol's refusals

    def new_run(self):
        """The job (re)started the ranks: no request yet, none left on disk."""
        self.asked_at = None
        self.requeue_asked = self.waiting = False
        try:
            os.unlink(self.request)
        except OSError:
            pass

    def turn(self, complete_at=lambda: 0.0):
        """One look (agent/supervisor/supervisor.py calls it every turn; squeue runs every few
        seconds). ``complete_at()``: when the node's newest complete checkpoint was saved."""
        answer = self.watch.look()
        return self._decide(*answer, complete_at) if answer else None

    def after_exit(self, wait_s=15.0):
        """The ranks failed: ``("end", why, job state)`` when it is because the job ended
        (``scancel``: Slurm kills what it tracks of the job, the run's store among it, before
        this node's next look, so a node's torchrun may fail first); with ``--requeue``,
        ``("wait", why)`` when it is because the job was requeued (another node ended its
        ranks first, maybe before this node's own look crossed the line), looked for up to
        ``wait_s`` while Slurm ends the job's run (COMPLETING); None for a job still running
        (a failure of the run's own) or an answer that says nothing."""
        if self.waiting:
            return None
        if not self.requeue:
            return self._ended(self.watch.look(force=True))
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            answer = self.watch.look(force=True)
            state = fields_of(answer[1])[0] if answer and answer[0] == 0 else ""
            if state in QUEUED:
                return self._decide(*answer)
            if state not in ALIVE and state != "COMPLETING" and self._ended(answer):
                return self._ended(answer)  # cancelled, timed out: not a requeue
            if state == "RUNNING":  # (a requeue makes it PENDING or COMPLETING at once)
                # ... unless it already runs again: Slurm let it start before this node
                # looked (its start time tells); else the ranks' own failure
                return self._decide(*answer) if self._ran_again(answer[1]) else None
            time.sleep(1.0)
        return None

    def _ended(self, answer):
        """``("end", why, job state)`` when a squeue ``answer`` says the job is over."""
        if answer is None:
            return None
        gone = job_end(self.watch.job, *answer)
        return ("end", gone, fields_of(answer[1])[0] if answer[0] == 0 else "") if gone else None

    def _ran_again(self, out):
        """Whether the job (RUNNING) started again since this node's run began: requeued and
        running again between two of this node's looks, which never saw it queued."""
        start = fields_of(out)[5]
        return bool(self.requeue and self.started and start and start != self.started)

    def _decide(self, code, out, err, complete_at=lambda: 0.0):
        state, reason, left, nodes, end, start = fields_of(out)
        if code == 0 and state == "RUNNING" and not self.waiting and self._ran_again(out):
            self.started = ""  # (the resume below takes the new one)
            return self._queued("requeued; it already runs again")
        if code == 0 and state == "RUNNING" and not self.started:
            self.started = start
        if code == 0 and self.requeue and state == "COMPLETING":
            return None  # a requeue passes through it too: the state after it says which
        if code == 0 and self.requeue and state in QUEUED:
            return self._queued(reason if reason not in ("", "None") else state)
        if code == 0 and state == "RUNNING" and self.waiting:
            if not self._holds_me(nodes):
                return ("end", "Slurm job %s runs again on other nodes (%s): this node's "
                        "part of the run ended" % (self.watch.job, nodes), "")
            self.round = "".join(c for c in end if c.isdigit())
            self.started = start
            return ("resume", "Slurm job %s runs again: the ranks start from the last "
                    "complete checkpoint" % self.watch.job)
        gone = job_end(self.watch.job, code, out, err)
        if gone:  # (the state, for the judge's word for the run's end: agent/rules/judge.py)
            return ("end", gone, state if code == 0 else "")
        if code == 0 and state == "RUNNING" and self.before is not None:
            return self._near_limit(seconds_left(left), end, complete_at)
        return None

    def _queued(self, why):
        if self.waiting:
            return None
        self.waiting = True
        return ("wait", "Slurm job %s requeued (%s): the ranks end; they start again from the "
                "last complete checkpoint when it runs" % (self.watch.job, why))

    def _near_limit(self, left, end, complete_at):
        if left is None or left > self.before:
            return None
        if self.asked_at is None:
            # when the time left crossed the line: any node's request, and the checkpoint the
            # ranks agreed on, came after it (each node's squeue looks a few seconds apart)
            self.asked_at = time.time() - (self.before - left)
            number = "".join(c for c in end if c.isdigit()) or "1"  # the same on every node
            tmp = self.request + ".tmp"
            with open(tmp, "w") as f:
                f.write("%s Slurm job %s: %d s left before its time limit (%s)\n"
                        % (number, self.watch.job, left, end))
            os.replace(tmp, self.request)
        if not (self.requeue and self.requeuer and not self.requeue_asked
                and (complete_at() >= self.asked_at or left <= REQUEUE_LATE_S)):
            return None
        self.requeue_asked = True
        try:
            res = subprocess.run([self.scontrol, "requeue", self.watch.job],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            res = subprocess.CompletedProcess([], 1, "", str(exc))
        if res.returncode != 0:  # (a job of salloc's: Slurm requeues batch jobs only)
            if self.log:
                self.log("scontrol requeue %s: %s" % (self.watch.job, res.stderr.strip()))
            return None
        return self._queued("scontrol requeue, %d s before its time limit" % left)

    def rejoin_argv(self, argv):
        """torchrun's ``argv`` for the ranks started again after a requeue: a rendezvous id of
        this time the job runs (the same on every node), since the last one was closed by the
        torchrun that ended first (its workers' peers gone)."""
        argv = list(argv)
        if self.round and "--rdzv-id" in argv[:-1]:
            at = argv.index("--rdzv-id") + 1
            argv[at] = "%s-%s" % (argv[at].split("-job")[0], "job" + self.round)
        return argv

    def _holds_me(self, nodes):
        """Whether the job's node list (``node[0-3]``) names this node; True when it cannot
        tell (no scontrol to expand it)."""
        try:
            res = subprocess.run([self.scontrol, "show", "hostnames", nodes],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return True
        return res.returncode != 0 or self.node in res.stdout.split()

    @classmethod
    def from_env(cls, node, node_dir, limit=None, log=None, environ=None):
        """The turns of this process's job (``RANKDECK_SLURM_JOB``), or None outside one."""
        watch = JobWatch.from_env(environ)
        if watch is None:
            return None
        return cls(watch, node, node_dir, limit, shutil.which("scontrol") or "scontrol", log)


# the signal the run's judge sends the batch script of a job rankdeck submitted, once the
# run is over (console/slurm/submit.py batch_script traps both): USR1 it succeeded (the job
# COMPLETED, exit 0), USR2 it failed or was stopped (the job FAILED, exit 1)
RELEASE_SIGNALS = {True: "USR1", False: "USR2"}
# scancel's words for a job that is over already (an attached console cancelled it first)
ENDED_ALREADY = ("already completing or completed", "Invalid job id")


def release_job(job, succeeded):
    """End job ``job`` (rankdeck submitted it; its run is over) by signalling its batch
    script, so its nodes are not held idle to the time limit; its end state says how the run
    ended. First the job's comment says the judge ends it (:data:`JUDGE_COMMENT`): a job that
    ends FAILED without it was ended by Slurm (a start it could not make, a node's failure),
    not once the run was over. None when done, else why not (no scancel here, Slurm's
    refusal)."""
    scancel = shutil.which("scancel")
    if scancel is None:
        return "scancel is not on this host's PATH"
    comment = "%s the run %s" % (JUDGE_COMMENT, "succeeded" if succeeded else "did not succeed")
    try:  # (a comment Slurm refuses costs only the words status gives: console/slurm/slurm.py)
        subprocess.run([shutil.which("scontrol") or "scontrol", "update", "JobId=" + job,
                        "Comment=" + comment], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        res = subprocess.run([scancel, "--batch", "--signal=" + RELEASE_SIGNALS[bool(succeeded)],
                              job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "scancel: %s" % exc
    said = (res.stderr or res.stdout).strip()
    if res.returncode != 0 and not any(over in said for over in ENDED_ALREADY):
        return "scancel: %s" % (said[-200:] or "exit %s" % res.returncode)
    return None
