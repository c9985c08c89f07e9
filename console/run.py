"""RunController: one run across the hosts of an inventory. Pure asyncio, no Textual.

It owns one NodeLink per host and the run's RunState, and is an async context manager that
closes them: ``async with RunController(...) as ctl``. Launch: connect to every host at once,
send the code (``--sync DIR``, console/sync.py), check the hosts (preflight), start the
rendezvous store on the first host, start a supervisor (and so torchrun) on every host,
subscribe to every node's journal. A run is never started on only some of the hosts: if any
host cannot be reached, synced or started, nothing is started or what was started is stopped.

Leaving a followed run is the controller's too (:meth:`RunController.leave`, called by the
verb that showed it), and so is the exit code that says how it went
(:meth:`RunController.exit_code`): the TUI and the headless view only display.

Over 450 lines: launch (with sync, preflight and one path for every failure), control and
leaving all act on the same links, record and housekeeping tasks; the launch is the part
that could move out next.
"""

from __future__ import annotations

import asyncio
import secrets as _secrets
import sys
import time
from dataclasses import asdict

from inventory.model import Host, Inventory
from . import rendezvous, run_env, slurm
from .errors import (EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, AgentError,
                     LaunchError, UsageError)
from .expel import expel
from .finish import ends_due
from .history import History, host_record, inventory_from_record
from .judged import judged, settle
from .consoles import Me
from .autocordon import follow_judge, keep_spare_spec, spares_running, warm_spares
from .link import NodeLink
from .liveness import beside_judge, check_stalls, verdict_again_due
from .preflight import HostCheck, check_table, run_preflight
from .sanitize import Masker, clean_tree, mask_tree, secret_warnings
from .scrollback import PAGE_BYTES
from .spec import (STATIC_WORLD, STATIC_WORLD_RESTART, LaunchSpec, launcher_name, new_run_id,
                   node_commands, run_root)  # LaunchSpec: callers' too
from .sync import Manifest, SyncError, build_manifest, progress_line, sync_hosts
from .state import RUN_ENDED, RunState
from .surgery import ACTIVE, SPARE, CordonPlan, nnodes_range, plan_cordon, store_host
from .transport.base import HostUnreachable, Transport
from .why import take_verdict

ATTACH_BACKLOG = 4 << 20  # journal bytes per node a TUI attach reads log lines from
# SSH handshakes under way at once: ~20 ms of laptop CPU each (docs/SCALE.md), so 64 finish
# well inside a host's connect timeout even on one busy core
CONNECT_AT_ONCE = 64
# on top of the run's grace (its workers' time between SIGTERM and SIGKILL): what a stop or
# restart may take for the agent to end torchrun's process tree and confirm it is gone
STOP_SLACK_S = 120
JOB_EVERY_S = 30.0  # how often an attached console asks squeue for a Slurm run's job


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
        self._tasks: list[asyncio.Task] = []
        self._ending: set[str] = set()  # nodes being stopped by console/finish.py's rules
        self._ending_stops: list[asyncio.Task] = []  # their stop requests
        self._verdict_task: asyncio.Task | None = None
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
        # set on every state change: wakes wait_done() and caught_up() (no polling)
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

    # -- launch ----------------------------------------------------------------------------
    def roles(self) -> dict[str, str]:
        """{node: role} of every node (console/surgery.py: active, spare, cordoned)."""
        return {name: ns.role for name, ns in self.state.nodes.items()}

    def in_run(self) -> list[str]:
        """The nodes the run was started on or took in since: all but the spares."""
        return [n for n, role in self.roles().items() if role != SPARE and n in self.links]

    def run_hosts(self) -> list[Host]:
        """The hosts of this run in node-rank order: those it was started on, a spare put in
        at the place of the node it replaced, a cordoned one out (``order``, console/cordon.py)."""
        order = (self.record or {}).get("order")
        if order:
            hosts = {h.name: h for h in self.inventory.hosts}
            return [hosts[name] for name in order if name in hosts]
        roots = (self.record or {}).get("run_roots")
        return [h for h in self.inventory.hosts if not roots or h.name in roots]

    def node_spec(self, host: Host, spec: LaunchSpec, endpoint: str,
                  hosts: list[Host] | None = None) -> dict:
        """``host``'s start spec; ``hosts``: the run's in node-rank order (default: now's)."""
        cmd = node_commands(hosts or self.run_hosts(), spec, self.run_id, endpoint,
                            lambda h: self.root_of(h.name))[host.name]
        env = {k: v.value for k, v in host.env.items()}
        env.update(cmd.env)  # the launcher's (console/launchers.py); the user's --env wins
        env.update(spec.env)
        return {
            "run_id": self.run_id,
            "node": host.name,
            "argv": cmd.argv,
            "hostfile": cmd.hostfile,
            "cwd": host.workdir,
            "env": env,
            # masked in causes: the host's secrets, and an --env value replacing any secret
            "secret_env": sorted({k for k, v in host.env.items() if v.secret} |
                                 (set(spec.env) & run_env.secret_names(self.inventory))),
            # and each ${VAR} filled into a secret value (`Bearer ${TOKEN}`): printed alone
            "secret_parts": sorted({p for v in host.env.values() if v.secret for p in v.parts}),
            "grace": spec.grace,
            "launcher": launcher_name(spec),  # named in the node's causes and phases
            "max_restarts": spec.max_restarts,
            "metrics_regex": spec.metrics_regex,
            "checkpoint_dir": spec.checkpoint_dir,
            # where the run's judge listens; its token only from the console that made it (a
            # later console's restart: the host kept it, agent/judge_wire.py)
            "judge": self.judge_ref,
            # before the Slurm job's time limit (agent/slurm_job.py): the first node requeues
            "slurm_limit": {"signal_before": spec.signal_before, "requeue": spec.requeue,
                            "requeuer": host.name == self.run_hosts()[0].name}
            if spec.signal_before is not None else None,
        }

    def mask_env_secrets(self, env: dict[str, str]) -> None:
        """Mask ``env``'s values for names the inventory marks secret (``--env TOKEN=...``)
        too. `launch` calls it; call it before a view is built, which takes the secrets."""
        self.secrets = sorted(set(self.secrets) |
                              set(run_env.launch_secrets(self.inventory, env)))
        self.state.masker = Masker(self.secrets)

    async def launch(self, spec: LaunchSpec, allow_partial: bool = False,
                     inventory_path: str = "", preflight: bool = True) -> str:
        """Start ``spec`` on every host (``allow_partial``: on those that can be reached);
        the run id. LaunchError (its exit code, each host's cause) when it cannot: see
        :meth:`_launch_failed` for what a failed launch leaves."""
        try:
            return await self._launch(spec, allow_partial, inventory_path, preflight)
        except LaunchError as exc:
            await self._launch_failed(exc)
            raise
        except Exception as exc:  # a bug or a transport's unexpected error: still a failure
            self.launch_error = LaunchError(str(exc), EXIT_FAILED)
            raise

    async def _launch_failed(self, exc: LaunchError) -> None:
        """What every failed launch leaves, whichever view shows it: the error (the exit
        code), each node it names marked failed with its cause (unless the node says why
        already: unreachable, sync or preflight failed), a saved run record saying
        ``failed``, and every link closed (what was started has been stopped)."""
        self.launch_error = exc
        for node, cause in exc.causes.items():
            ns = self.state.nodes.get(node)
            if ns is not None and ns.state != "unreachable" and not ns.state.endswith("failed"):
                self.state.set_node(node, "failed", str(cause))
        if self.record:
            self.record["state"] = "failed"
            self.history.save(self.record)
        await self.close()

    async def _launch(self, spec: LaunchSpec, allow_partial: bool, inventory_path: str,
                      preflight: bool) -> str:
        self.state.started = time.time()
        self.spec = spec
        self.state.nproc = spec.nproc_per_node  # bounds what a node may claim (ownership.py)
        self.state.launcher = launcher_name(spec)
        self.mask_env_secrets(spec.env)
        for warning in secret_warnings(self.secrets):
            self.state.add_event(None, "warning", warning)
        for ns in self.state.nodes.values():
            ns.max_restarts = spec.max_restarts
        # listed and hashed while the connections open (a thread: it reads every file)
        listing = asyncio.ensure_future(asyncio.to_thread(
            build_manifest, spec.sync, True, spec.sync_include)) if spec.sync else None
        failed = await self.connect_all()
        if failed and not allow_partial:
            if listing is not None:
                listing.cancel()
            raise LaunchError("cannot reach %d of %d hosts; nothing was started:\n%s" % (
                len(failed), len(self.inventory.hosts),
                "\n".join(cause_line(n, e) for n, e in failed.items())), EXIT_UNREACHABLE,
                failed)
        hosts = [h for h in self.inventory.hosts if h.name not in failed]
        if not any(not h.spare for h in hosts):
            raise LaunchError("only spares can be reached; nothing was started", EXIT_UNREACHABLE,
                              failed)
        # where the store and judge survive the cordon of any node (console/surgery.py)
        rdzv = store_host(self.inventory, hosts)
        active = [h for h in hosts if not h.spare]
        synced = await self._launch_sync(hosts, listing) if listing is not None else None
        if preflight:  # the store's host first: preflight probes the rendezvous from it
            await self._launch_preflight([rdzv] + [h for h in hosts if h is not rdzv], spec)
        self.record = {
            "run_id": self.run_id, "created": time.time(), "inventory": inventory_path,
            "transport": self.inventory.transport, "hosts": [host_record(h) for h in hosts],
            "run_roots": {h.name: run_root(h, self.run_id) for h in hosts},
            "rdzv_host": rdzv.name, "spec": asdict(spec), "state": "starting",
            "sync": synced, "nnodes": str(len(active)),
            "order": [h.name for h in active],  # node-rank order (run_hosts)
            # spares and cordoned nodes (docs/SURGERY.md); surgeries: who did what, when
            "roles": {h.name: SPARE for h in hosts if h.spare}, "surgeries": [],
        }
        # what a restart from another shell needs (console/run_env.py): secrets by name only
        self.record["spec"]["env"], self.record["secret_env"] = run_env.spec_env_record(
            spec.env, self.inventory)
        self.history.save(self.record)
        for h in active:
            self.state.set_node(h.name, "starting")
        await self.hold_nodes(hosts)
        try:
            store = await self.links[rdzv.name].request(
                "store_start", run_root=self.root_of(rdzv.name), addr=rdzv.addr,
                python=rdzv.python or sys.executable, timeout=180)
        except AgentError as exc:
            raise LaunchError("%s: could not start the rendezvous store: %s"
                              % (rdzv.name, exc), EXIT_FAILED) from None
        endpoint = "%s:%d" % (rdzv.addr, store["port"])
        self.record["rdzv_endpoint"] = endpoint
        await self._start_judge(rdzv, active, spec)
        if spec.auto_cordon and self.judge_ref and rdzv.spare:
            await keep_spare_spec(self, rdzv, spec, endpoint)
        self.state.add_event(rdzv.name, "rendezvous", "rendezvous store at %s%s" % (
            endpoint, "; " + store["note"][:300] if store.get("note") else ""))
        # each node keeps the record (no secret values): what `watch RUN -i` on another
        # laptop reads (console/hosted_record.py)
        started = await self.gather_nodes(
            lambda link: link.request("start", run_root=link.run_root, node=link.name,
                                      spec=self.node_spec(link.host, spec, endpoint),
                                      record=self.record),
            [h.name for h in active])
        bad = {n: r for n, r in started.items() if isinstance(r, BaseException)}
        if bad:
            await self.gather_nodes(lambda link: link.request(
                "stop", run_root=link.run_root, node=link.name),
                [n for n in started if n not in bad])
            await self.links[rdzv.name].request("store_stop", run_root=self.root_of(rdzv.name))
            raise LaunchError("could not start on %s; the run was stopped:\n%s" % (
                ", ".join(bad), "\n".join(cause_line(n, e) for n, e in bad.items())),
                EXIT_FAILED, bad)
        await warm_spares(self, spec, endpoint, bool(slurm.job_of(self.inventory.transport or "")))
        self.history.save(self.record)
        await self.subscribe_all()
        return self.run_id

    async def _launch_sync(self, hosts: list[Host], listing: asyncio.Future) -> dict:
        """Send the ``--sync`` tree into every host's workdir; returns what the run record
        keeps of it (its tree hash). LaunchError, nothing started, when the tree cannot be
        listed (exit 2) or any host fails to take it (that host's cause)."""
        try:
            manifest: Manifest = await listing
        except SyncError as exc:
            raise LaunchError("--sync: %s; nothing was started" % exc, EXIT_USAGE) from None
        for h in hosts:
            self.state.set_node(h.name, "syncing")
        for path, why in manifest.skipped:
            self.state.add_event(None, "sync", "sync: %s: %s" % (path, why))
        last: dict = {}

        def report(progress: dict, final: bool = False) -> None:
            last.update(progress)
            line = progress_line(progress)
            for listener in list(self.sync_listeners):
                listener(line, final)

        def caller(link: NodeLink):
            def call(op: str, args: dict):
                if op == "sync_commit":  # kept in the node's action log (agent/actions.py)
                    args = dict(args, run_root=link.run_root, node=link.name)
                return link.request(op, timeout=300, **args)
            return call

        results = await sync_hosts({h.name: caller(self.links[h.name]) for h in hosts},
                                   manifest, {h.name: h.workdir for h in hosts}, report)
        report(last, True)
        bad = {}
        for name, res in results.items():
            if isinstance(res, (AgentError, SyncError, OSError)):
                bad[name] = res
                self.state.set_node(name, "sync failed", "sync: %s" % res)
            elif isinstance(res, BaseException):
                raise res  # a bug, not a host's answer
            else:
                self.state.add_event(name, "sync", "code %s: tree %s in %s" % (
                    "unchanged" if res.same else "synced (%d file(s), %.1f MB sent)" % (
                        res.files_sent, res.bytes_sent / 1e6), manifest.tree[:12],
                    res.workdir))
        if bad:
            raise LaunchError("could not send %s to %d of %d hosts; nothing was started:\n%s"
                              % (manifest.root, len(bad), len(hosts),
                                 "\n".join(cause_line(n, e) for n, e in bad.items())),
                              EXIT_FAILED, bad)
        return {"tree": manifest.tree, "dir": manifest.root, "files": len(manifest.entries),
                "bytes": manifest.bytes, "source": manifest.source}

    async def preflight(self, hosts: list[Host] | None = None, failed: dict | None = None,
                        spec: LaunchSpec | None = None) -> list[HostCheck]:
        """Check ``hosts`` (default: every host; the first is the rendezvous host) over their
        connected links; ``failed``: {host: error} of those that could not be reached.
        ``spec``: also check that its script (or module) is on every host."""
        hosts = list(hosts or self.inventory.hosts)
        script = spec.script if spec is not None and not spec.launcher else None
        self.preflight_checks = await run_preflight(
            self.links, {h.name: h for h in hosts}, failed or {}, hosts[0].name,
            script=script, module=bool(spec and spec.module), launching=spec is not None)
        return self.preflight_checks

    async def _launch_preflight(self, hosts: list[Host], spec: LaunchSpec) -> None:
        """Preflight before a launch, shown per node; LaunchError if any host has a problem
        (exit 2 when one is a mistake in the inventory or run spec, like a missing script)."""
        for h in hosts:
            self.state.set_node(h.name, "preflight")
        checks = await self.preflight(hosts, spec=spec)
        for c in checks:
            if c.ok:
                self.state.add_event(c.name, "preflight", "preflight ok (torch %s, %d GPU(s))"
                                     % (c.facts.get("torch"), len(c.facts.get("gpus") or [])))
            else:
                self.state.set_node(c.name, "preflight failed", "; ".join(c.problems))
        if not all(c.ok for c in checks):
            raise LaunchError("preflight found problems; nothing was started (rankdeck launch "
                              "--skip-preflight starts anyway):\n%s" % check_table(checks),
                              EXIT_USAGE if any(c.bad_input for c in checks) else EXIT_FAILED,
                              {c.name: "; ".join(c.problems) for c in checks if not c.ok})

    async def recent_lines_only(self, keep: int = ATTACH_BACKLOG) -> None:
        """Before subscribing: take only the last ``keep`` bytes of each node's journal as log
        lines (metrics, checkpoints and events still come from the start). What a TUI needs to
        attach to a run of many hours at once; older lines are fetched on scrolling back."""
        async def one(link: NodeLink):
            st = await link.request("state", run_root=link.run_root, node=link.name)
            link.quiet_until = max(link.quiet_until, int(st.get("journal_size") or 0) - keep)
            # now, not only at subscribe(): the panes take their floors from it when shown
            self.state.nodes[link.name].data_from = link.quiet_until

        await self.gather_nodes(one, self.connected())

    async def subscribe_all(self) -> None:
        # a spare has no journal until it is put in (console/cordon.py subscribes it then)
        await self.gather_nodes(lambda link: link.subscribe(),
                                [n for n in self.connected() if n in self.in_run()])
        await self._subscribe_judge()
        self._tasks.append(asyncio.ensure_future(self._housekeeping()))
        job = slurm.job_of(self.inventory.transport or "")
        if job:
            self._tasks.append(asyncio.ensure_future(self._follow_job(job)))

    async def _follow_job(self, job: str) -> None:
        """A Slurm run's job now (state, time left) in ``state.slurm``, for the header, and
        the nodes Slurm has drained, down or failing (``nodes``), for the nodes table."""
        while True:
            now, words = await slurm.job_and_nodes(self.transport, self.inventory.hosts, job)
            self.state.set_slurm(dict(now, at=time.time(), nodes=words))
            await asyncio.sleep(JOB_EVERY_S)

    # -- the run's judge (agent/judge.py, console/judged.py) ---------------------------------
    async def _start_judge(self, rdzv: Host, hosts: list[Host], spec: LaunchSpec) -> None:
        """Start the run's judge beside the store; a host whose agent has none (an older one)
        leaves this console judging, which it says."""
        token = _secrets.token_hex(32)
        # the nodes started now; a spare joins the judge's view when put in (console/cordon.py)
        settings = {"addr": rdzv.addr, "token": token, "nodes": [h.name for h in hosts],
                    "stall_after": spec.stall_after, "on_hang": spec.on_hang,
                    "on_nan": spec.on_nan,
                    "max_wall": spec.max_wall, "notify": spec.notify,
                    "notify_on": spec.notify_on, "max_restarts": spec.max_restarts,
                    "launcher": spec.launch_with,  # DeepSpeed's --on-hang restart: every node
                    "secrets": list(self.secrets),
                    # node surgery by the judge (agent/judge_cordon.py, docs/SURGERY.md)
                    "cordon_within_s": spec.cordon_within, "auto_cordon": spec.auto_cordon,
                    "spares": [h.name for h in self.inventory.spares],
                    "nnodes_min": nnodes_range(spec.nnodes, len(hosts))[0],
                    # a job `submit` made ends with the run (docs/SLURM.md)
                    "release_job": slurm.job_of(self.inventory.transport or "")
                    if spec.release_job else None}
        try:
            info = await self.links[rdzv.name].request(
                "judge_start", run_root=self.root_of(rdzv.name), spec=settings, timeout=60)
        except AgentError as exc:
            why = "its agent has none (older than this console)" if exc.kind == "usage" \
                else str(exc)
            self.state.add_event(rdzv.name, "judge", "no judge on the hosts (%s): this console "
                                 "judges the run, only while it is attached" % why)
            return
        self.record["judge"] = {"host": rdzv.name, "addr": rdzv.addr, "port": info.get("port")}
        self.judge_ref = {"addr": rdzv.addr, "port": info.get("port"), "token": token}

    def judge_host(self) -> str | None:
        return (self.record.get("judge") or {}).get("host")

    async def _subscribe_judge(self) -> None:
        host = self.judge_host()
        link = self.links.get(host) if host else None
        if link is None or link.stream is None:
            return
        try:
            await link.subscribe_judge()
        except AgentError as exc:
            self.state.add_event(host, "judge", "the judge's journal cannot be read (%s): this "
                                 "console judges the run" % exc)

    # -- an existing run -------------------------------------------------------------------
    @classmethod
    def from_record(cls, record: dict, transport: Transport, history: History) -> RunController:
        ctl = cls(inventory_from_record(record), transport, history, run_id=record["run_id"],
                  max_restarts=record.get("spec", {}).get("max_restarts", 0))
        ctl.record = record
        ctl.state.started = record.get("created", ctl.state.started)
        # non-secret values come from the record, secrets again from this shell
        restored = run_env.restore(record, ctl.inventory)
        spec = dict(record.get("spec", {}))
        spec["env"] = restored.spec_env
        ctl.spec = LaunchSpec(**spec)
        ctl.state.launcher = launcher_name(ctl.spec)
        ctl.state.nproc = ctl.spec.nproc_per_node
        ctl.missing_env = restored.missing
        ctl.secrets = sorted(set(ctl.inventory.secrets) | set(restored.secrets))
        ctl.state.masker = Masker(ctl.secrets)
        for name, role in (record.get("roles") or {}).items():
            if name in ctl.state.nodes and role in (SPARE, "cordoned"):
                ctl.state.set_role(name, role)
        judge = record.get("judge") or {}
        ctl.judge_ref = {"addr": judge.get("addr"), "port": judge.get("port")} if judge else None
        ctl.state.stall_min_s = ctl.spec.stall_after
        return ctl

    def check_restartable(self, node: str | None = None) -> None:
        """UsageError (exit 2) when a secret of the run is not known in this shell, so that
        ``node`` (None: every node) would restart without it; says which and how to fix it.
        Under DeepSpeed's launcher every node restarts (:meth:`static_world`): each is checked."""
        names = [node] if node and not self.static_world() else [h.name for h in
                                                                 self.inventory.hosts]
        why = []
        for name in names:
            for reason in self.missing_env.get(name, []):
                if reason not in why:
                    why.append(reason)
        if why:
            raise UsageError("cannot restart %s of run %s: its environment is not complete in "
                             "this shell; nothing was stopped or restarted:\n  %s"
                             % (node or "the nodes", self.run_id, "\n  ".join(why)))

    async def caught_up(self, timeout: float = 60.0) -> None:
        """Wait until every connected node's journal has been replayed to its current end and
        its state.json has arrived (or ``timeout`` passed: a node that stopped sending is not
        waited for longer). The state comes after the journal is drained: `status` printed
        before it would show the node's torchrun phase as unknown."""
        async def one(link: NodeLink):
            st = await link.request("state", run_root=link.run_root, node=link.name)
            size = st.get("journal_size")
            if size is None:
                return
            node = self.state.nodes[link.name]
            has_state = st.get("state") != "missing"  # no state.json: no state message comes
            try:
                # (a journal its agent can read no further, stream_end: as far as it goes)
                await asyncio.wait_for(self._until(
                    lambda: (node.journal_offset >= size or node.stream_end is not None)
                    and (node.state_seen or not has_state)), timeout)
            except asyncio.TimeoutError:
                pass
        # the nodes this console follows: a spare's journal (a warm spare's held torchrun) is
        # not read until it is put in, and waiting for it would wait the whole timeout
        followed = [n for n in self.connected() if self.links[n].subscribed]
        if followed:
            await self.gather_nodes(one, followed)
        judge = self.links.get(self.judge_host() or "")
        if judge is not None and judge.judge_subscribed:
            st = await judge.request("state", run_root=judge.run_root, node="judge")
            size = st.get("journal_size") or 0
            try:
                await asyncio.wait_for(self._until(
                    lambda: self.state.judge_offset >= size or "judge" in judge.stream_ends),
                    timeout)
            except asyncio.TimeoutError:
                pass

    async def _until(self, condition) -> None:
        """Return once ``condition()`` holds, checked after every change of the run's state."""
        # No await between the check and clear(): a change cannot slip in unseen.
        while not condition():
            self._changed.clear()
            await self._changed.wait()

    # -- control ---------------------------------------------------------------------------
    def stop_timeout(self) -> float:
        """How long a stop or restart of a node may take: the run's grace (LaunchSpec's
        default before a launch) and ``STOP_SLACK_S`` for the agent to confirm."""
        return (self.spec.grace if self.spec is not None else LaunchSpec.grace) + STOP_SLACK_S

    async def stop(self, node: str | None = None) -> dict:
        """Stop one node or, without ``node``, every node (not the spares, which never
        started) and the rendezvous store; {node: the agent's answer or its error}."""
        names = [node] if node else self.in_run() + await spares_running(self)
        results = await self.gather_nodes(
            lambda link: link.request("stop", run_root=link.run_root, node=link.name,
                                      timeout=self.stop_timeout()), names)
        if node is None:
            await self.stop_store()
        return results

    async def stop_store(self) -> None:
        """The run is over: end its rendezvous store and its judge (which says how the run
        ended and sends its last notifications first)."""
        for op, host in (("store_stop", self.record.get("rdzv_host")),
                         ("judge_stop", self.judge_host())):
            if host and host in self.links and self.links[host].stream is not None:
                try:
                    await self.links[host].request(op, run_root=self.root_of(host))
                except AgentError:
                    pass

    def static_world(self) -> str | None:
        """What a restart of this run says when its launcher starts one static world
        (DeepSpeed's: every node restarts, on a fresh store, docs/LAUNCHERS.md); else None."""
        launcher = self.spec.launch_with if self.spec is not None else None
        return STATIC_WORLD_RESTART.get(launcher)

    async def restart(self, node: str | None = None) -> dict:
        """Restart one node (it rejoins the rendezvous) or, without ``node``, every node.
        Under a static world (:meth:`static_world`) every node, on a fresh store's port."""
        self.check_restartable(node)
        names = [node] if node else [n for n, r in self.roles().items()
                                     if r == ACTIVE and n in self.links]
        if node is not None and self.roles().get(node, ACTIVE) != ACTIVE:
            why = ("%s is cordoned: rankdeck never restarts it (`rankdeck uncordon` makes it a "
                   "spare)" if self.roles()[node] != SPARE else
                   "%s is a spare: `rankdeck cordon --replace-with` puts it in") % node
            self.state.add_event(node, "refused", why)
            return {node: AgentError(why, "refused")}
        static = self.static_world()
        if static:
            names = [n for n, r in self.roles().items() if r == ACTIVE and n in self.links]
        refusal = await self.restart_refusal(names)
        if refusal:  # nothing was touched: every node answers with the reason
            self.state.add_event(node, "refused", refusal)
            return {n: AgentError(refusal, "refused") for n in names}
        endpoint, port = self.record.get("rdzv_endpoint", ""), None
        if static:
            try:
                endpoint = await self._fresh_store()
            except AgentError as exc:
                self.state.add_event(None, "refused", str(exc))
                return {n: exc for n in names}
            port = int(endpoint.rpartition(":")[2])
            self.state.add_event(None, "restarting", "%s (master port %d)" % (static, port))
        for n in names:
            self.state.set_node(n, "restarting")
            self.state.add_event(n, "restarting", "restart requested from the console")

        try:  # a supervisor the restart starts again lives in it (a Slurm cgroup site)
            await self.hold_nodes([self.inventory.host(n) for n in names])
        except LaunchError as exc:
            return {n: AgentError(str(exc), "refused") for n in names}

        def req(link: NodeLink):
            spec = self.node_spec(link.host, self.spec, endpoint)
            extra = {"master_port": port} if port is not None else {}
            return link.request("restart", run_root=link.run_root, node=link.name, spec=spec,
                                timeout=self.stop_timeout(), **extra)
        said = await self.gather_nodes(req, names)
        # each old torchrun, gone now, out of the rendezvous: the new ones' round need not
        # wait for its entry to expire (console/expel.py)
        await asyncio.gather(*(expel(self, n, r.get("member")) for n, r in said.items()
                               if isinstance(r, dict) and isinstance(r.get("member"), dict)))
        return said

    async def hold_nodes(self, hosts: list[Host]) -> None:
        """What holds the run's processes on ``hosts`` beyond this console (a Slurm site's
        rankdeck-host step: console/transport/slurm.py); LaunchError when it cannot."""
        hold = getattr(self.transport, "hold_nodes", None)
        if hold is None:
            return

        async def ask_up(names):
            said = await self.gather_nodes(lambda link: link.request("host_up"), names)
            return {n for n, r in said.items() if isinstance(r, dict) and r.get("up")}
        try:
            await hold(hosts, ask_up)
        except RuntimeError as exc:
            raise LaunchError("%s; nothing was started" % exc, EXIT_FAILED) from None

    async def _fresh_store(self) -> str:
        """A static world's restart: the rendezvous host's store stopped and started again on
        a port it picks (agent/static_world.py); the new endpoint, kept in the run record.
        AgentError (nothing else touched) when that host cannot do it."""
        host = self.inventory.host(self.record["rdzv_host"])
        link = self.links.get(host.name)
        if link is None or link.stream is None:
            raise AgentError("%s (the rendezvous host) is not connected: the store cannot start "
                             "again; no node was restarted" % host.name, "closed")
        store = await link.request("store_start", run_root=self.root_of(host.name),
                                   addr=host.addr, python=host.python or sys.executable,
                                   fresh=True, timeout=180)
        endpoint = "%s:%d" % (host.addr, store["port"])
        if not store.get("fresh"):  # an agent without fresh stores answers with the running one
            raise AgentError("%s: the store did not start again on a new port; no node was "
                             "restarted" % host.name, "refused")
        self.record["rdzv_endpoint"] = endpoint
        self.history.save(self.record)
        return endpoint

    def cordon_plan(self, node: str, replace_with: str | None = None) -> CordonPlan:
        """What cordoning ``node`` would do now (console/surgery.py); console/cordon.py does it."""
        nnodes = (self.spec.nnodes if self.spec is not None else None) or self.record.get("nnodes")
        launcher = self.spec.launch_with if self.spec is not None else None
        return plan_cordon(self.state, self.inventory, nnodes, node, replace_with,
                           self.record.get("rdzv_host"), STATIC_WORLD.get(launcher))

    async def restart_refusal(self, names: list[str]) -> str | None:
        """Why restarting ``names`` now must wait (a rendezvous under way: console/rendezvous.py),
        judged on every node's state as its agent says it now; None: go ahead."""
        # the run's nodes: a spare (a warm one's torchrun waits before the rendezvous) and a
        # cordoned node are in no rendezvous of it
        active = {n: ns for n, ns in self.state.nodes.items() if ns.role == ACTIVE}
        states = await self.gather_nodes(lambda link: link.request(
            "state", run_root=link.run_root, node=link.name, timeout=30),
            [n for n in active if n in self.links])
        for name, st in states.items():
            if isinstance(st, dict):
                self.state.apply_supervisor_state(name, st)
        return rendezvous.restart_refusal(active, list(self.state.ranks.values()),
                                          names, time.time(), self.state.stall_min_s)

    async def stacks(self, names: list[str] | None = None) -> dict:
        """Every rank's Python stack on the named nodes: {node: {"ranks": [...]}}."""
        return await self.gather_nodes(
            lambda link: link.request("stacks", run_root=link.run_root, node=link.name,
                                      python=link.host.python or sys.executable, timeout=60),
            names)

    async def scrollback(self, node: str, files: list[int], before: int,
                         since: int = 0) -> tuple[list, int]:
        """Log records of ``files`` on ``node`` from before journal offset ``before`` (and not
        before ``since``): a page of older lines than the console keeps (console/scrollback.py)."""
        link = self.links.get(node)
        if link is None:
            raise AgentError("%s: not connected" % node, "closed")
        data = await link.request("scrollback", run_root=link.run_root, node=node, files=files,
                                  before=before, since=since, bytes=self.page_bytes,
                                  timeout=30)
        return data["recs"], int(data["start"])

    # -- lifetime --------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        last_save = float("-inf")
        while True:
            await asyncio.sleep(1.0)
            if judged(self.state):  # the judge on the hosts applies the rules
                settle(self.state)
                await follow_judge(self)  # its own surgeries (--auto-cordon)
                if beside_judge(self.state):  # the rules an older judge does not apply
                    self._start_verdict()
            else:
                if check_stalls(self.state) or verdict_again_due(self.state):
                    self._start_verdict()
                if not self.me.read_only:
                    self._end_finished_nodes()
            now = time.monotonic()
            if now - last_save > 5 or self.state.run_state() in RUN_ENDED:
                last_save = now
                self.save_status()

    def _end_finished_nodes(self) -> None:
        """Stop, once each, the nodes whose torchrun waits for what cannot come now that the
        run is over (console/finish.py), telling each node how it ended."""
        for name, end in ends_due(self.state).items():
            link = self.links.get(name)
            if name in self._ending or link is None or link.stream is None:
                continue
            self._ending.add(name)
            self.state.add_event(name, "ending", end["say"])
            task = asyncio.ensure_future(self._stop_as(link, end))
            self._tasks.append(task)
            self._ending_stops.append(task)

    async def _stop_as(self, link: NodeLink, end: dict) -> None:
        try:
            await link.request("stop", run_root=link.run_root, node=link.name,
                               end={"state": end["state"], "cause": end["cause"]},
                               timeout=self.stop_timeout())
        except AgentError as exc:
            self._ending.discard(link.name)  # asked again on the next round
            self.state.add_event(link.name, "ending", "stopping it failed: %s" % exc)

    def _start_verdict(self) -> None:
        """A stall was just seen: say who is stuck (console/why.py), unless already asking."""
        if self._verdict_task is None or self._verdict_task.done():
            self._verdict_task = asyncio.ensure_future(self.why())
            self._tasks.append(self._verdict_task)

    async def why(self) -> dict:
        """Who is stuck now: the verdict, also kept in ``state.verdict``. The run's judge takes
        it when there is one (every console then shows the same); else this console does."""
        link = self.links.get(self.judge_host() or "")
        if link is not None and link.stream is not None:
            try:
                verdict = await link.request("judge", run_root=link.run_root, ask="why",
                                             timeout=90)
            except AgentError as exc:
                self.state.add_event(link.name, "judge", "the judge did not answer (%s): this "
                                     "console takes the verdict" % exc)
            else:
                verdict = mask_tree(clean_tree(verdict), self.state.masker)
                self.state.set_verdict(verdict)
                return verdict
        return await take_verdict(self)

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
        await self._until(lambda: self.state.run_state() in RUN_ENDED)
        # A node the end rules stop (console/finish.py) counts as ended once its supervisor
        # says so, a moment before that process is gone; its stop request returns only when
        # nothing of the node is left, so the run is over when those stops are too.
        pending = [t for t in self._ending_stops if not t.done()]
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
        return EXIT_FAILED if self.state.run_state() in ("failed", "stopped") else EXIT_OK

    async def close(self) -> None:
        """Close every link and the transport (the run goes on). Safe to call again."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*(l.close() for l in self.links.values()), return_exceptions=True)
        await self.transport.close()


def cause_line(name: str, exc: BaseException) -> str:
    """``  node1: no-python: python '/x' not found; ...`` (one host's failure, one line)."""
    cause = getattr(exc, "cause", None) or getattr(exc, "kind", None) or "error"
    msg = str(exc)
    if msg.startswith(name + ":"):
        msg = msg[len(name) + 1:].lstrip()
    return "  %s: %s: %s" % (name, cause, msg)
