"""A warm spare's supervisor, before a cordon puts the node in (docs/SURGERY.md, "Warm spares").

At launch the console starts each spare's supervisor with ``hold`` in its spec: torchrun starts
as for any node, and rankdeck's hook in it (agent/torchrun/spare_gate.py) holds it before its rendezvous,
torch imported, on the read end of a pipe this supervisor keeps the write end of. The node's
state is ``held``. What may come next, each seen at once (signals wake the loop):

- a cordon puts the spare in: agent/node/ops.py ``start`` finds the held supervisor, checks the
  start spec is the one it holds (:func:`digest`), and sends SIGUSR2; this loop writes the go
  byte, the launch is counted (``launched``, ``warm``) and the supervisor goes on as any node's;
- a stop (SIGTERM: ``rankdeck stop``, a fence): torchrun killed and verified as any node's;
- torchrun ends while held (a torch that cannot be held, a kill from outside): the supervisor
  ends ``failed`` with why; a later cordon starts the spare cold;
- the run is over (its judge says so, or cannot be reached for :data:`JUDGE_LOST_S`): nothing
  will put the spare in, and it must not outlive its run: stopped, with that as its cause.

The judge is asked in a thread of its own (a connection may take seconds to time out; a put-in
must not wait behind it). A run without a judge gets no warm spare (the console's choice).
"""

import hashlib
import json
import os
import signal
import threading
import time

from ..wire import judge as judge_wire
from ..host import procs
from ..torchrun import spare_gate

ASK_EVERY = 2.0  # seconds between two questions to the judge: is the run over?
JUDGE_LOST_S = 60.0  # the judge unreachable this long: the run is taken as over
# not what the spare would run (the secrets: :func:`digest`)
KEPT_OUT = ("hold", "judge", "digest", "restarted", "node_dir", "secret_env", "secret_parts")


def digest(spec, secret=()):
    """What a start spec runs (argv, env, folders, settings), as short hashes by part (each
    env variable a part of its own, ``env.NAME``): a put-in's spec must be the held one's,
    else the held torchrun is not the process asked for. Left out: the judge's address and
    token (kept on the host anyway), the hold itself, and the secrets (the spec's
    ``secret_env`` names and ``secret``): a later console reads them again from its own shell
    (console/launch/env.py), and the held torchrun has the values the run was launched with.
    Hashes only: no value is kept."""
    def short(value):
        text = json.dumps(value, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    hidden = set(secret) | set(secret_names(spec))
    parts = {k: short(v) for k, v in spec.items() if k not in KEPT_OUT and k != "env"}
    env = spec.get("env") if isinstance(spec.get("env"), dict) else {}
    parts.update(("env." + k, short(v)) for k, v in env.items() if k not in hidden)
    return parts


def secret_names(spec):
    """The env names ``spec`` holds secrets in."""
    names = spec.get("secret_env")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def differences(held, asked):
    """The parts (:func:`digest`) in which two specs differ, sorted; empty when alike."""
    held = held if isinstance(held, dict) else {}
    return sorted(k for k in set(held) | set(asked) if held.get(k) != asked.get(k))


class RunEnd:
    """Asks the run's judge every :data:`ASK_EVERY` s whether the run is over (``ping``'s
    ``over``); ``why`` is set once it is, or once the judge has not answered for
    :data:`JUDGE_LOST_S` s."""

    def __init__(self, spec_judge, run_root):
        spec_judge = spec_judge or {}
        self.addr, self.port = spec_judge.get("addr"), spec_judge.get("port")
        self.token = spec_judge.get("token") or judge_wire.read_token(run_root)
        self.why = None
        self.done = threading.Event()

    def start(self):
        if not (self.addr and self.port and self.token):
            self.why = "the run has no judge to say when it is over; a warm spare needs one"
            return
        threading.Thread(target=self._run, name="spare-run-end", daemon=True).start()

    def stop(self):
        self.done.set()

    def _run(self):
        answered = time.monotonic()
        while not self.done.wait(ASK_EVERY):
            try:
                over = self.ask()
            except (OSError, judge_wire.WireError, ValueError):
                if time.monotonic() - answered >= JUDGE_LOST_S:
                    self.why = ("the run's judge has not answered for %.0f s: the run is taken "
                                "as over" % JUDGE_LOST_S)
                    return
                continue
            answered = time.monotonic()
            if over:
                self.why = "the run is over: the warm spare was not needed"
                return

    def ask(self):
        answer = judge_wire.ask(self.addr, int(self.port), self.token, "ping", 5.0,
                                hello_timeout=5.0) or {}
        if not answer.get("ok"):
            raise ValueError("no answer")
        return bool((answer.get("data") or {}).get("over"))


class Hold:
    """The held part of a supervisor's life (``sup``: agent/supervisor/supervisor.py's Supervisor, its
    signal handlers and follower's wake set up); starts the held torchrun."""

    def __init__(self, sup):
        self.sup = sup
        read, self.go = os.pipe()  # the write end stays here (not inherited: O_CLOEXEC)
        sup.save(digest=digest(sup.spec), secret_names=secret_names(sup.spec))
        sup.launch(gate=read)
        self.run_end = RunEnd(sup.spec.get("judge"), os.path.dirname(sup.node_dir))

    def wait(self):
        """None once the spare is put in (torchrun released, the launch counted), else the
        supervisor's exit code: it ended while held (stopped, torchrun gone, run over)."""
        sup = self.sup
        self.run_end.start()
        try:
            while True:
                sup.recorder.pump()
                while True:
                    sig = sup.next_request()  # only what serve asked
                    if sig is None:
                        break
                    if sig == signal.SIGTERM:
                        return sup.stop_now()
                    if sig == signal.SIGUSR2 and self.release():
                        return None
                    # SIGUSR1 (a restart) of a held spare: nothing runs yet to restart
                code = sup.reap_torchrun()
                if code is not None:
                    sup.recorder.pump(final=True)
                    report = procs.kill_run(os.getpid(), sup.marker, grace=1.0)
                    return sup.finish("failed", code, report, cause={"message": (
                        "the warm spare's torchrun ended while held (exit %s; see its "
                        "torchrun.log); a cordon starts this spare cold" % code)})
                if self.run_end.why:
                    return sup.finish("stopped", None, sup.kill(0),
                                      cause={"message": self.run_end.why})
                sup.follower.wait(0.0 if sup.follower.watch is not None else 0.05, 1.0)
        finally:
            self.run_end.stop()

    def release(self):
        """The gate opens: torchrun makes its rendezvous handler and joins the round. False
        when it had ended already (its end is reaped next turn, and said)."""
        sup = self.sup
        if self.go is None:
            return False
        try:
            os.write(self.go, spare_gate.GO)
        except OSError:  # nobody reads it any more: torchrun is gone
            return False
        finally:
            os.close(self.go)
            self.go = None
        launches = sup.state["launches"] + 1
        sup.save(state="running", launches=launches, warm=True)
        sup.recorder.event("launched", pid=sup.torchrun, launch=launches, warm=True)
        return True
