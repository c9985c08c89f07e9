"""RunController: one run across the hosts of an inventory. Pure asyncio, no Textual.

It owns one NodeLink per host and the run's RunState, and is an async context manager that
closes them: ``async with RunController(...) as ctl``. The connections are its own; its
other jobs are modules that it hands itself: the launch (console/run/launch.py: connect,
sync, preflight, store, judge, supervisors; on every host or on none), following a run and
attaching to one (console/run/attach.py), the run's judge (console/run/judge.py), a
recorded run taken up again (console/run/record.py), stopping and restarting nodes
(console/run/control.py), and its rounds once a second (console/run/housekeeping.py).

Leaving a followed run is the controller's too (:meth:`RunController.leave`, called by the
verb that showed it), and so is the exit code that says how it went
(:meth:`RunController.exit_code`): the TUI and the headless view only display.
"""

from __future__ import annotations

import asyncio

from inventory.model import Host, Inventory
from . import (
    attach as run_attach, control as run_control, judge as run_judge, launch as run_launch,
    record as run_record
)
from ..launch import env as run_env
from ..errors import EXIT_FAILED, EXIT_OK, AgentError, LaunchError
from ..records.history import History, inventory_from_record
from ..model.consoles import Me
from .link import NodeLink
from .preflight import HostCheck
from .housekeeping import Housekeeping
from ..lines.sanitize import Masker
from ..model.scrollback import PAGE_BYTES
from ..launch.spec import STATIC_WORLD_RESTART, LaunchSpec, new_run_id, run_root  # LaunchSpec: callers' too
from ..model.state import RUN_ENDED, RunState
from ..surgery.surgery import SPARE, CordonPlan
from ..transport.base import HostUnreachable, Transport

# SSH handshakes under way at once: ~20 ms of laptop CPU each (docs/SCALE.md), so 64 finish
# well inside a host's connect timeout even on one busy core
CONNECT_AT_ONCE = 64
# on top of the run's grace (its workers' time between SIGTERM and SIGKILL): what a stop or
# restart may take for the agent to end torchrun's process tree and confirm it is gone
STOP_SLACK_S = 120


class RunController:
    """One run: its links, its state, launch and control. Use as ``async with``; leaving the
    block (or :meth:`close`) closes every link and the transport, and leaves the run going."""

    def __init__(self, inventory: Inventory, transport: Transport, history: History | None = None,
                 run_id: str | None = None, max_restarts: int = 3):
        self.inventory = inventory
        self.transport = transport
        self.history = history or History()
        self.run_id = run_id or new_run_id()
        self.state = RunState(self.run_id, [(h.name, h.addr) for h in inventory.hosts],
                              max_restarts=max_restarts,
                              slots={h.name: h.slots for h in inventory.hosts})
        self.links: dict[str, NodeLink] = {}
        self.record: dict = {}
        self.spec: LaunchSpec | None = None  # what launch() starts (a recorded run: its record's)
        self.launch_error: LaunchError | None = None  # why launch() failed, when it did
        self.judge_ref: dict | None = None  # where the run's judge listens (node specs carry it)
        self.tasks: list[asyncio.Task] = []  # beside it (rounds, stops, verdicts); close() ends
        self.housekeeping = Housekeeping(self)  # its rounds while it follows the run
        self.judge_surgeries_seen = 0  # of state.judge_surgeries, in the record (follow_judge)
        self.secrets = inventory.secrets
        self.state.masker = Masker(self.secrets)
        self.preflight_checks: list[HostCheck] = []
        # called with (progress line, final) while --sync sends code (headless, the header)
        self.sync_listeners: list = []
        self.missing_env: dict[str, list[str]] = {}  # {node: why a secret is not known here}
        self.page_bytes = PAGE_BYTES  # log data per scrollback request
        self.connect_at_once = CONNECT_AT_ONCE
        # who this console is; read_only: it only watches (every link's agent refuses it
        # changes, and this controller makes none of its own: no end rules, no store stop)
        self.me = self.state.operators.me = Me.here()
        self._closed = False
        # set on every state change: wakes until() (no polling)
        self._changed = asyncio.Event()
        self.state.change_listeners.append(lambda _node: self._changed.set())
        for h in inventory.spares:
            self.state.set_role(h.name, SPARE)

    async def __aenter__(self) -> RunController:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    # -- connections -----------------------------------------------------------------------
    def root_of(self, name: str) -> str:
        if self.record.get("run_roots"):
            return self.record["run_roots"][name]
        return run_root(self.inventory.host(name), self.run_id)

    async def connect_all(self, reconnect: bool = True) -> dict[str, Exception]:
        """Connect to every host, ``CONNECT_AT_ONCE`` at a time (each host's connect timeout
        counts from its own start, so a thousand handshakes on one laptop core do not time
        out the last ones: docs/SCALE.md); returns {host: error} for the ones that failed."""
        for h in self.inventory.hosts:
            if h.name not in self.links:
                self.links[h.name] = NodeLink(h, self.transport, self.state, self.root_of(h.name),
                                              reconnect=reconnect, me=self.me)
        names = [h.name for h in self.inventory.hosts]
        slots = asyncio.Semaphore(self.connect_at_once)

        async def one(name: str):
            async with slots:
                return await self.links[name].connect()

        results = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        failed = {}
        for name, res in zip(names, results):
            if isinstance(res, BaseException):
                if not isinstance(res, (HostUnreachable, AgentError, OSError)):
                    raise res
                failed[name] = res
                cause = getattr(res, "cause", getattr(res, "kind", "error"))
                self.state.set_node(name, "unreachable", "%s: %s" % (cause, res))
            else:
                self.state.set_node(name, "connected")
        return failed

    def connected(self) -> list[str]:
        """The nodes whose agent is connected now."""
        return [name for name, link in self.links.items() if link.stream is not None]

    async def gather_nodes(self, fn, names=None) -> dict:
        """Run ``fn(link)`` on every (named) node at once; {name: result or exception}."""
        names = list(names or self.links)
        results = await asyncio.gather(*(fn(self.links[n]) for n in names),
                                       return_exceptions=True)
        return dict(zip(names, results))

    # -- the run's nodes and settings ------------------------------------------------------
    def roles(self) -> dict[str, str]:
        """{node: role} of every node (console/surgery/surgery.py: active, spare, cordoned)."""
        return {name: ns.role for name, ns in self.state.nodes.items()}

    def in_run(self) -> list[str]:
        """The nodes the run was started on or took in since: all but the spares."""
        return [n for n, role in self.roles().items() if role != SPARE and n in self.links]

    def run_hosts(self) -> list[Host]:
        """The hosts of this run in node-rank order: those it was started on, a spare put in
        at the place of the node it replaced, a cordoned one out (``order``, console/surgery/cordon.py)."""
        order = (self.record or {}).get("order")
        if order:
            hosts = {h.name: h for h in self.inventory.hosts}
            return [hosts[name] for name in order if name in hosts]
        roots = (self.record or {}).get("run_roots")
        return [h for h in self.inventory.hosts if not roots or h.name in roots]

    def judge_host(self) -> str | None:
        return (self.record.get("judge") or {}).get("host")

    def mask_env_secrets(self, env: dict[str, str]) -> None:
        """Mask ``env``'s values for names the inventory marks secret (``--env TOKEN=...``)
        too. `launch` calls it; call it before a view is built, which takes the secrets."""
        self.secrets = sorted(set(self.secrets) |
                              set(run_env.launch_secrets(self.inventory, env)))
        self.state.masker = Masker(self.secrets)

    def stop_timeout(self) -> float:
        """How long a stop or restart of a node may take: the run's grace (LaunchSpec's
        default before a launch) and ``STOP_SLACK_S`` for the agent to confirm."""
        return (self.spec.grace if self.spec is not None else LaunchSpec.grace) + STOP_SLACK_S

    def static_world(self) -> str | None:
        """What a restart of this run says when its launcher starts one static world
        (DeepSpeed's: every node restarts, on a fresh store, docs/LAUNCHERS.md); else None."""
        launcher = self.spec.launch_with if self.spec is not None else None
        return STATIC_WORLD_RESTART.get(launcher)

    # -- the launch (console/run/launch.py), following the run (console/run/attach.py) -----
    def node_spec(self, host: Host, spec: LaunchSpec, endpoint: str,
                  hosts: list[Host] | None = None) -> dict:
        """``host``'s start spec; ``hosts``: the run's in node-rank order (default: now's)."""
        return run_launch.node_spec(self, host, spec, endpoint, hosts)

    async def launch(self, spec: LaunchSpec, allow_partial: bool = False,
                     inventory_path: str = "", preflight: bool = True) -> str:
        """Start ``spec`` on every host (``allow_partial``: on those that can be reached);
        the run id. LaunchError (its exit code, each host's cause) when it cannot."""
        return await run_launch.launch(self, spec, allow_partial, inventory_path, preflight)

    async def preflight(self, hosts: list[Host] | None = None, failed: dict | None = None,
                        spec: LaunchSpec | None = None, **deep) -> list[HostCheck]:
        """Check ``hosts`` (default: every host; the first is the rendezvous host); ``deep``:
        the deep check's facts too (``deep=True, ckpt_dir=...``: console/run/deep.py)."""
        return await run_launch.preflight(self, hosts, failed, spec, **deep)

    async def start_judge(self, rdzv: Host, hosts: list[Host], spec: LaunchSpec) -> None:
        """At launch: the run's judge beside the store (console/run/judge.py)."""
        await run_judge.start_judge(self, rdzv, hosts, spec)

    async def recent_lines_only(self, keep: int = run_attach.ATTACH_BACKLOG) -> None:
        """Before subscribing: only the last ``keep`` bytes of each journal as log lines."""
        await run_attach.recent_lines_only(self, keep)

    async def subscribe_all(self) -> None:
        """Follow the run: every node's journal, the judge's, the rounds."""
        await run_attach.subscribe_all(self)

    async def caught_up(self, timeout: float = 60.0) -> None:
        """Wait until every followed journal has been replayed to its current end."""
        await run_attach.caught_up(self, timeout)

    # -- a recorded run (console/run/record.py) --------------------------------------------
    @classmethod
    def from_record(cls, record: dict, transport: Transport, history: History) -> RunController:
        """A controller of the run ``record`` says (its spec, roles, judge; secrets from here)."""
        ctl = cls(inventory_from_record(record), transport, history, run_id=record["run_id"],
                  max_restarts=record.get("spec", {}).get("max_restarts", 0))
        run_record.restore(ctl, record)
        return ctl

    def check_restartable(self, node: str | None = None) -> None:
        """UsageError (exit 2) when a secret of the run is not known in this shell."""
        run_record.check_restartable(self, node)

    # -- control (console/run/control.py) --------------------------------------------------
    async def stop(self, node: str | None = None) -> dict:
        """Stop one node or, without ``node``, every node and the rendezvous store."""
        return await run_control.stop(self, node)

    async def stop_store(self) -> None:
        """The run is over: end its rendezvous store and its judge."""
        await run_control.stop_store(self)

    async def restart(self, node: str | None = None) -> dict:
        """Restart one node or, without ``node``, every node."""
        return await run_control.restart(self, node)

    async def hold_nodes(self, hosts: list[Host]) -> None:
        """What holds the run's processes on ``hosts`` beyond this console (LaunchError)."""
        await run_control.hold_nodes(self, hosts)

    def cordon_plan(self, node: str, replace_with: str | None = None) -> CordonPlan:
        """What cordoning ``node`` would do now; console/surgery/cordon.py does it."""
        return run_control.cordon_plan(self, node, replace_with)

    async def restart_refusal(self, names: list[str]) -> str | None:
        """Why restarting ``names`` now must wait; None: go ahead."""
        return await run_control.restart_refusal(self, names)

    async def stacks(self, names: list[str] | None = None) -> dict:
        """Every rank's Python stack on the named nodes: {node: {"ranks": [...]}}."""
        return await run_control.stacks(self, names)

    async def scrollback(self, node: str, files: list[int], before: int,
                         since: int = 0) -> tuple[list, int]:
        """Log records of ``files`` on ``node`` from before journal offset ``before``."""
        return await run_control.scrollback(self, node, files, before, since)

    # -- lifetime --------------------------------------------------------------------------
    async def why(self) -> dict:
        """Who is stuck now: the judge's verdict, or this console's (console/run/judge.py)."""
        return await run_judge.why(self)

    def status(self) -> dict:
        """The ``status --json`` document (docs/STATUS.md): RunState's, with what the run
        record adds (``sync``: the tree sent with ``--sync``, or null)."""
        status = self.state.status()
        status["sync"] = self.record.get("sync")
        return status

    def save_status(self) -> None:
        if self.record:
            self.record["state"] = self.state.run_state()
            self.record["status"] = self.status()
            self.history.save(self.record)

    async def wait_done(self) -> str:
        """Wait for the run to end; its end state (one of RUN_ENDED)."""
        await self.until(lambda: self.state.run_state() in RUN_ENDED)
        # A node the end rules stop (agent/rules/judge.py ends_due) counts as ended once its supervisor
        # says so, a moment before that process is gone; its stop request returns only when
        # nothing of the node is left, so the run is over when those stops are too.
        pending = [t for t in self.housekeeping.ending_stops if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.stop_timeout())
        return self.state.run_state()

    async def leave(self) -> None:
        """The console stops following the run (the TUI quit, the headless view saw it end
        or was detached): a run that ended has its rendezvous store stopped, and the run's
        status is saved for `ls` and a later console. After a failed launch, nothing more:
        it recorded and stopped what it had. The links stay open until :meth:`close`."""
        if self.launch_error is not None:
            return
        if self.state.run_state() in RUN_ENDED and not self.me.read_only:
            await self.stop_store()
        self.save_status()

    def exit_code(self) -> int:
        """The exit code of a console that followed the run (console/errors.py): a failed
        launch's own; 1 the run failed or was stopped; 0 it succeeded, or it goes on (the
        console detached) or has not started."""
        if self.launch_error is not None:
            return self.launch_error.code
        return EXIT_FAILED if self.state.run_state() in ("failed", "stopped", "gone") \
            else EXIT_OK

    async def close(self) -> None:
        """Close every link and the transport (the run goes on). Safe to call again."""
        if self._closed:
            return
        self._closed = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*(l.close() for l in self.links.values()), return_exceptions=True)
        await self.transport.close()

    async def until(self, condition) -> None:
        """Return once ``condition()`` holds, checked after every change of the run's state."""
        # No await between the check and clear(): a change cannot slip in unseen.
        while not condition():
            self._changed.clear()
            await self._changed.wait()
