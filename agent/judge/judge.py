"""The run's judge: one process per run, on the rendezvous host, that applies the run's rules
whether or not a console is attached, and writes what it decides into its own journal.

Why here: the judge must live as long as the run and be reachable by every node, and the
rendezvous host is where the run already depends on a process of its own (the store,
agent/store/tcpstore.py); a judge that dies with that host dies with a run that could not go on
anyway (docs/DESIGN-NOTES.md, "The judge", lists the failure cases).

How: it listens on the rendezvous address (agent/judge/listen.py; agent/wire/judge.py: a token
handshake); each node's supervisor connects (agent/supervisor/judge_link.py) and forwards the metas of its
journal and its state.json; the judge keeps a RunView (agent/rules/judge_view.py) and every second
applies the rules (agent/rules/judge.py): stalls (also of a run whose ranks print no steps,
from their CPU), the verdict when a stall starts and again while it lasts
(agent/judge/sample.py: it asks every node for its ranks' stacks and flight-recorder tails,
twice, and decides with agent/rules/verdict.py), a rendezvous that waits and for whom, nodes whose
torchrun waits for what cannot come, the run's end, a node in trouble again soon after its
restart (``cordon proposed``). Policies the user turned on act through the judge
(agent/judge/policy.py; ``on_hang``: restart the node the verdict names within the restart
budget, or stop the run; ``on_nan``: stop the run at a rank's first inf or NaN loss;
``max_wall``; the cordon policy to come acts in :meth:`Judge.propose_cordon`); ``notify`` runs
a command for the events the user picked (agent/judge/notify.py). Every decision is an event in
``<run_root>/judge/journal``, which a console reads as it reads a node's (docs/PROTOCOL.md "The
judge").

Here: the ``Judge`` (its journal, the rules every second, its life and end) and the process.
Its connections, its verdicts and its policies are classes it mixes in, over its one view,
set of lines and journal.

Standard library only; Python >= 3.9. ``python -m agent judge RUN_ROOT`` with its spec (token,
settings, secrets) on stdin, as the supervisor takes its spec.
"""

import json
import os
import signal
import sys
import threading
import time

from . import notify as judge_notify
from ..host import procs
from .cordon import AutoCordon
from .figures import RunFigures
from .goodput import JudgeGoodput
from ..host.journal import JournalWriter
from .listen import Listener
from .loops import LoopPolicy
from .policy import Policies
from .prometheus import prometheus_said, serve_metrics
from ..rules.judge import (
    CORDON_WITHIN_S, RULES, check_stalls, check_waiting, ends_due, event, run_over, stall_began,
    verdict_again_due
)
from .sample import Sampler
from ..rules.judge_view import RunView
from .control import judge_dir
from ..rules.mask import Masker
from ..host.runfiles import write_json_atomic
from ..slurm.job import release_job

TICK = 1.0
SETTLE = 5.0  # after the run ended: the last events reach the journal, then the judge ends
ALONE_END = 300.0  # no supervisor connected for this long (from the start, too): the judge ends


class Judge(Listener, Sampler, Policies, LoopPolicy):
    """The run's judge: its connections (agent/judge/listen.py), its verdicts
    (agent/judge/sample.py) and its policies (agent/judge/policy.py) over one view, one set of
    lines and one journal; here the journal, the rules every second and the judge's life."""

    def __init__(self, spec, jdir):
        self.spec = spec
        self.jdir = jdir
        self.token = spec["token"]
        cordon_within = spec.get("cordon_within_s", CORDON_WITHIN_S)
        flagged = spec.get("flagged")  # hosts flagged by their record (agent/rules/fleet.py)
        self.view = RunView(spec["nodes"], spec.get("stall_after", 60.0),
                            cordon_within if isinstance(cordon_within, (int, float)) else 0,
                            [n for n in flagged if isinstance(n, str)]
                            if isinstance(flagged, list) else ())
        self.on_hang = spec.get("on_hang") or "warn"
        self.on_nan = spec.get("on_nan") or "warn"  # stop: the run, at a first inf/NaN loss
        self.max_wall = spec.get("max_wall")
        self.max_restarts = int(spec.get("max_restarts") or 0)
        self.restarts = {}  # node -> restarts the judge asked for
        self.loops_init(spec)  # --on-loop, --loop-restarts (agent/judge/loops.py)
        self.masker = Masker(spec.get("secrets") or [])
        self.notifier = judge_notify.Notifier(spec.get("notify"), spec.get("notify_on"),
                                              self.masker, self.write)
        self.lock = threading.RLock()
        self.lines = {}  # node -> NodeLine
        self.journal = JournalWriter(os.path.join(jdir, "journal"))
        self.started = time.time()
        self.clock0 = time.monotonic()
        self.verdict_running = False
        self.ending = set()  # nodes the judge is stopping
        self.unsent_stops = {}  # node -> its end: stops decided while it had no line
        self.over = None
        self.stop = threading.Event()
        self.surgeon = AutoCordon(self, spec)  # --auto-cordon (agent/judge/cordon.py)
        self.figures = RunFigures()  # --prometheus (agent/judge/prometheus.py), fed with the view
        self.prometheus = None  # its url, or why it could not listen
        self.goodput = JudgeGoodput(jdir)  # fed as records come, its report every 30 s

    # -- the journal -----------------------------------------------------------------------
    def write(self, rec):
        # every string: a waiting event's phases carry notes from torchrun's own records
        rec = self.masker.mask_tree(dict(self.loop_verdict(rec), ts=time.time()))
        with self.lock:
            self.journal.append(rec)
            self.goodput.add(None, rec)
        self.notifier.consider(rec)
        if rec.get("what") == "cordon proposed":
            self.propose_cordon(rec)

    def now(self):
        return time.monotonic() - self.clock0

    # -- the rules, every second -----------------------------------------------------------
    def tick(self):
        now = self.now()
        with self.lock:
            news = check_stalls(self.view, now) + check_waiting(self.view, now)
            start_verdict = stall_began(self.view, news) and not self.verdict_running
            again = not self.verdict_running and verdict_again_due(self.view, now)
            if start_verdict or again:
                self.verdict_running = True
            ends = ends_due(self.view)
            over = run_over(self.view) if self.over is None else None
        for ev in news:
            self.write(ev)
        if start_verdict or again:
            reason = "a stall began" if start_verdict else "the stall goes on"
            threading.Thread(target=self._verdict_then_act, args=(reason,), daemon=True).start()
        if ends:
            for node, end in ends.items():
                if node not in self.ending:
                    self.write(event("ending", node, text=end["text"]))
            self.stop_nodes({n: {"state": e["state"], "cause": e["cause"]}
                             for n, e in ends.items()})
        if self.max_wall and time.time() - self.started > self.max_wall and \
                not self.ending.issuperset(self.view.nodes):
            self.write(event("policy", None, action="stop",
                             text="--max-wall %.0f s reached: stopping the run" % self.max_wall))
            self.stop_nodes({n: {"state": "stopped", "cause": {
                "message": "--max-wall %.0f s reached" % self.max_wall}}
                for n in self.view.nodes})
        if over is not None:
            self.over = over
            state, cause = over
            self.write(event("run_ended", None, state=state, cause=cause,
                             text="the run %s%s" % (state, ": %s: %s" % (
                                 cause.get("node"), cause.get("message"))
                                 if cause and cause.get("message") else "")))

    def run(self, sock):
        threading.Thread(target=self.serve, args=(sock,), daemon=True).start()
        self.write(event("judge", None, action="started", stall_after=self.view.stall_after,
                         on_hang=self.on_hang, on_nan=self.on_nan, max_wall=self.max_wall,
                         on_loop=self.on_loop, loop_restarts=self.loops.after,
                         notify=bool(self.spec.get("notify")), rules=list(RULES),
                         cordon_within_s=self.view.cordon_within_s,
                         auto_cordon=self.surgeon.on, prometheus=self.prometheus,
                         text="the judge watches the run on this host (stall after %.0f s, "
                         "on hang: %s)%s" % (self.view.stall_after, self.on_hang,
                                             prometheus_said(self.prometheus))))
        ended_at, settled = None, False
        alone_since = time.monotonic()  # no node connected since (none yet, at the start)
        while not self.stop.is_set():
            self.tick()
            if self.goodput.due():
                self.report_goodput()
            if self.over is not None:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at >= SETTLE:
                    settled = True
                    break
            with self.lock:
                alone = not self.lines
            if not alone:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since >= ALONE_END:
                # every supervisor gone without a last word (killed, hosts lost): nobody is
                # left to judge, and a judge must not outlive its run
                self.write(event("judge", None, action="ended",
                                 text="no node has been connected to the judge for %.0f s: it "
                                 "ends; a console judges what is left" % ALONE_END))
                break
            self.stop.wait(TICK)
        if self.over is None:  # stopped (SIGTERM): say how the run ended, if it has
            time.sleep(0.5)  # the nodes' last states, sent as their supervisors ended
            self.tick()
        self.report_goodput()
        self.surgeon.forget()
        self.notifier.drain()
        if settled:
            self.release_job()

    def report_goodput(self):
        """The run's goodput, as the judge has it now, into its folder (agent/judge/goodput.py)."""
        with self.lock:
            report = self.goodput.report(self.over is not None)
        self.goodput.write(report)

    def release_job(self):
        """The run is over by itself: the Slurm job rankdeck submitted for it ends now, not at
        its time limit (``spec.release_job``: its id). Last: on a cgroup site the job's end
        ends this process too (docs/SLURM.md)."""
        job = self.spec.get("release_job")
        if not isinstance(job, str) or not job.isdigit():
            return
        state = self.over[0]
        self.write(event("policy", None, action="release", text=(
            "the run %s: Slurm job %s, which rankdeck submitted for it, ends now (%s)"
            % (state, job, "COMPLETED" if state == "succeeded" else "FAILED"))))
        why = release_job(job, state == "succeeded")
        if why:
            self.write(event("policy", None, action="release", text=(
                "Slurm job %s could not be ended (%s): it holds its nodes until its time "
                "limit or `rankdeck stop`" % (job, why))))


def main(run_root):
    """``python -m agent judge RUN_ROOT``: read the spec from stdin, listen, judge."""
    spec = json.loads(sys.stdin.buffer.read())
    jdir = judge_dir(run_root)
    os.makedirs(jdir, 0o700, exist_ok=True)
    from ..store.tcpstore import listen_socket  # here: only the judge needs it
    sock = listen_socket(spec["addr"], int(spec.get("port") or 0))
    judge = Judge(spec, jdir)
    metrics = serve_metrics(judge, run_root)  # --prometheus: None without
    me = procs.stat(os.getpid())
    state = {"state": "running", "pid": os.getpid(), "starttime": me.starttime,
             "addr": spec["addr"], "port": sock.getsockname()[1], "started": judge.started,
             "prometheus": judge.prometheus}
    write_json_atomic(os.path.join(jdir, "state.json"), state)

    def stop(_signum, _frame):
        judge.stop.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    procs.ignore_job_signals()  # a Slurm job's --signal is the trainer's (agent/host/procs.py)
    try:
        judge.run(sock)
    finally:
        sock.close()
        if metrics is not None:
            metrics.close()
        state.update(state="exited", ended=time.time())
        write_json_atomic(os.path.join(jdir, "state.json"), state)
    return 0
