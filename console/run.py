"""RunController: one run across the hosts of an inventory. Pure asyncio, no Textual.

It owns one NodeLink per host and the run's RunState. Launch: connect to every host at once,
start the rendezvous store on the first host, start a supervisor (and so torchrun) on every
host, subscribe to every node's journal. A run is never started on only some of the hosts:
if any host cannot be reached or started, what was started is stopped again.
"""

from __future__ import annotations

import asyncio
import os
import secrets as _secrets
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field

from inventory.model import Host, Inventory
from .history import History, host_record
from .link import AgentError, NodeLink
from .scrollback import PAGE_BYTES
from .state import RunState
from .transport.base import HostUnreachable, Transport

ATTACH_BACKLOG = 4 << 20  # journal bytes per node a TUI attach reads log lines from

RDZV_CONF = "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3"


class LaunchError(Exception):
    """Launch refused or failed before the run was running; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 1, causes: dict | None = None):
        super().__init__(message)
        self.code = code
        self.causes = causes or {}


@dataclass
class LaunchSpec:
    """What to run. ``nnodes`` is "N" or "MIN:MAX" (default: every host of the inventory)."""

    script: str
    args: list[str] = field(default_factory=list)
    nproc_per_node: int | None = None
    max_restarts: int = 3
    nnodes: str | None = None
    grace: float = 10.0
    metrics_regex: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    module: bool = False  # script is a module name (torchrun -m)
    # An argv that replaces torchrun (benchmarks, non-torch launchers). It must write each
    # rank's output as torchrun's --log-dir layout under $RANKDECK_LOG_DIR.
    launcher: list[str] | None = None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + _secrets.token_hex(2)


def run_root(host: Host, run_id: str) -> str:
    return os.path.join(host.workdir, ".rankdeck", "runs", run_id)


def torchrun_argv(host: Host, spec: LaunchSpec, run_id: str, nnodes: str, endpoint: str,
                  log_dir: str) -> list[str]:
    python = host.python or sys.executable
    if spec.launcher:
        return list(spec.launcher) + [spec.script] + list(spec.args)
    argv = [
        python, "-m", "torch.distributed.run",
        "--nnodes", nnodes,
        "--nproc-per-node", str(spec.nproc_per_node or host.slots),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint,
        "--rdzv-id", run_id,
        # an elastic run proceeds 5 s after its last node arrived (FACTS.md)
        "--rdzv-conf", RDZV_CONF + (",last_call_timeout=5" if ":" in nnodes else ""),
        "--local-addr", host.addr,
        "--max-restarts", str(spec.max_restarts),
        "--monitor-interval", "1",
        "--log-dir", log_dir,
        "--redirects", "3",
    ]
    if spec.module:
        argv.append("-m")
    return argv + [spec.script] + list(spec.args)


class RunController:
    def __init__(self, inventory: Inventory, transport: Transport, history: History | None = None,
                 run_id: str | None = None, max_restarts: int = 3):
        self.inventory = inventory
        self.transport = transport
        self.history = history or History()
        self.run_id = run_id or new_run_id()
        self.state = RunState(self.run_id, [(h.name, h.addr) for h in inventory.hosts],
                              max_restarts=max_restarts)
        self.links: dict[str, NodeLink] = {}
        self.record: dict = {}
        self._tasks: list[asyncio.Task] = []
        self.secrets = inventory.secrets
        self.preflight_checks: list = []
        self.page_bytes = PAGE_BYTES  # log data per scrollback request

    # -- connections -----------------------------------------------------------------------
    def root_of(self, name: str) -> str:
        if self.record.get("run_roots"):
            return self.record["run_roots"][name]
        return run_root(self.inventory.host(name), self.run_id)

    async def connect_all(self, reconnect: bool = True) -> dict[str, Exception]:
        """Connect to every host at once; returns {host: error} for the ones that failed."""
        for h in self.inventory.hosts:
            if h.name not in self.links:
                self.links[h.name] = NodeLink(h, self.transport, self.state, self.root_of(h.name),
                                              reconnect=reconnect)
        names = [h.name for h in self.inventory.hosts]
        results = await asyncio.gather(*(self.links[n].connect() for n in names),
                                       return_exceptions=True)
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
    def node_spec(self, host: Host, spec: LaunchSpec, endpoint: str) -> dict:
        nnodes = spec.nnodes or str(len(self.inventory.hosts))
        root = self.root_of(host.name)
        env = {k: v.value for k, v in host.env.items()}
        env.update(spec.env)
        return {
            "run_id": self.run_id,
            "node": host.name,
            "argv": torchrun_argv(host, spec, self.run_id, nnodes, endpoint,
                                  os.path.join(root, host.name, "torchrun")),
            "cwd": host.workdir,
            "env": env,
            "grace": spec.grace,
            "max_restarts": spec.max_restarts,
            "metrics_regex": spec.metrics_regex,
        }

    async def launch(self, spec: LaunchSpec, allow_partial: bool = False,
                     inventory_path: str = "", preflight: bool = True) -> str:
        self.state.started = time.time()
        self.spec = spec
        for ns in self.state.nodes.values():
            ns.max_restarts = spec.max_restarts
        failed = await self.connect_all()
        if failed and not allow_partial:
            await self.close()
            raise LaunchError("cannot reach %d of %d hosts; nothing was started:\n%s" % (
                len(failed), len(self.inventory.hosts),
                "\n".join(cause_line(n, e) for n, e in failed.items())), 3, failed)
        hosts = [h for h in self.inventory.hosts if h.name not in failed]
        rdzv = hosts[0]
        if preflight:
            await self._preflight(hosts, failed, rdzv)
        self.record = {
            "run_id": self.run_id, "created": time.time(), "inventory": inventory_path,
            "transport": self.inventory.transport, "hosts": [host_record(h) for h in hosts],
            "run_roots": {h.name: run_root(h, self.run_id) for h in hosts},
            "rdzv_host": rdzv.name, "spec": asdict(spec), "state": "starting",
        }
        self.record["spec"]["env"] = {k: "****" for k in spec.env}
        self.history.save(self.record)
        for h in hosts:
            self.state.set_node(h.name, "starting")
        try:
            store = await self.links[rdzv.name].request(
                "store_start", run_root=self.root_of(rdzv.name), addr=rdzv.addr,
                python=rdzv.python or sys.executable, timeout=180)
        except AgentError as exc:
            await self.close()
            raise LaunchError("%s: could not start the rendezvous store: %s"
                              % (rdzv.name, exc), 1) from None
        endpoint = "%s:%d" % (rdzv.addr, store["port"])
        self.record["rdzv_endpoint"] = endpoint
        self.state.add_event(rdzv.name, "rendezvous", "rendezvous store at %s" % endpoint)
        started = await self.gather_nodes(
            lambda link: link.request("start", run_root=link.run_root, node=link.name,
                                      spec=self.node_spec(link.host, spec, endpoint)),
            [h.name for h in hosts])
        bad = {n: r for n, r in started.items() if isinstance(r, BaseException)}
        if bad:
            await self.gather_nodes(lambda link: link.request(
                "stop", run_root=link.run_root, node=link.name),
                [n for n in started if n not in bad])
            await self.links[rdzv.name].request("store_stop", run_root=self.root_of(rdzv.name))
            self.record["state"] = "failed"
            self.history.save(self.record)
            await self.close()
            raise LaunchError("could not start on %s; the run was stopped:\n%s" % (
                ", ".join(bad), "\n".join(cause_line(n, e) for n, e in bad.items())), 1, bad)
        self.history.save(self.record)
        await self.subscribe_all()
        return self.run_id

    async def _preflight(self, hosts: list[Host], failed: dict, rdzv: Host) -> None:
        from .preflight import run_preflight, table

        for h in hosts:
            self.state.set_node(h.name, "preflight")
        checks = await run_preflight(self.links, {h.name: h for h in hosts}, {}, rdzv.name)
        self.preflight_checks = checks
        for c in checks:
            if c.ok:
                self.state.add_event(c.name, "preflight", "preflight ok (torch %s, %d GPU(s))"
                                     % (c.facts.get("torch"), len(c.facts.get("gpus") or [])))
            else:
                self.state.set_node(c.name, "preflight failed", "; ".join(c.problems))
        if not all(c.ok for c in checks):
            await self.close()
            raise LaunchError("preflight found problems; nothing was started (rankdeck launch "
                              "--skip-preflight starts anyway):\n%s" % table(checks), 1)

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
        await self.gather_nodes(lambda link: link.subscribe(), self.connected())
        self._tasks.append(asyncio.ensure_future(self._housekeeping()))

    # -- an existing run -------------------------------------------------------------------
    @classmethod
    def from_record(cls, record: dict, transport: Transport, history: History):
        from .history import inventory_from_record

        ctl = cls(inventory_from_record(record), transport, history, run_id=record["run_id"],
                  max_restarts=record.get("spec", {}).get("max_restarts", 0))
        ctl.record = record
        ctl.state.started = record.get("created", ctl.state.started)
        spec = dict(record.get("spec", {}))
        spec["env"] = {}  # secret values are never recorded: take them from the inventory
        ctl.spec = LaunchSpec(**spec)
        ctl._reload_env(record.get("inventory", ""))
        return ctl

    def _reload_env(self, path: str) -> None:
        """Real env values for a restart come from the inventory file, read again now."""
        from inventory.loader import load_inventory
        from inventory.model import InventoryError

        try:
            fresh = load_inventory(path) if path and os.path.exists(path) else None
        except InventoryError:
            fresh = None
        for h in self.inventory.hosts:
            try:
                h.env = fresh.host(h.name).env if fresh else {
                    k: v for k, v in h.env.items() if not v.secret}
            except KeyError:
                h.env = {k: v for k, v in h.env.items() if not v.secret}
        self.secrets = self.inventory.secrets

    async def attach(self) -> dict[str, Exception]:
        """Connect and replay every node's journal from the start, then follow it."""
        failed = await self.connect_all()
        await self.subscribe_all()
        return failed

    async def caught_up(self, timeout: float = 60.0) -> None:
        """Wait until every connected node's journal has been replayed to its current end."""
        async def one(link: NodeLink):
            st = await link.request("state", run_root=link.run_root, node=link.name)
            size = st.get("journal_size")
            deadline = time.monotonic() + timeout
            while (size is None or self.state.nodes[link.name].journal_offset < size) and \
                    time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                if size is None:
                    break
        await self.gather_nodes(one, self.connected())

    # -- control ---------------------------------------------------------------------------
    async def stop(self, node: str | None = None) -> dict:
        names = [node] if node else list(self.links)
        results = await self.gather_nodes(
            lambda link: link.request("stop", run_root=link.run_root, node=link.name,
                                      timeout=self.spec.grace + 120), names)
        if node is None:
            await self.stop_store()
        return results

    async def stop_store(self) -> None:
        rdzv = self.record.get("rdzv_host")
        if rdzv and rdzv in self.links and self.links[rdzv].stream is not None:
            try:
                await self.links[rdzv].request("store_stop", run_root=self.root_of(rdzv))
            except AgentError:
                pass

    async def restart(self, node: str | None = None) -> dict:
        """Restart one node (it rejoins the rendezvous) or, without ``node``, every node."""
        names = [node] if node else list(self.links)
        endpoint = self.record.get("rdzv_endpoint", "")
        for n in names:
            self.state.set_node(n, "restarting")
            self.state.add_event(n, "restarting", "restart requested from the console")

        def req(link: NodeLink):
            spec = self.node_spec(link.host, self.spec, endpoint)
            return link.request("restart", run_root=link.run_root, node=link.name, spec=spec,
                                timeout=self.spec.grace + 120)
        return await self.gather_nodes(req, names)

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
        last_save = 0.0
        while True:
            await asyncio.sleep(1.0)
            self.state.check_stalls()
            now = time.monotonic()
            if now - last_save > 5 or self.state.run_state() in ("succeeded", "failed",
                                                                   "stopped"):
                last_save = now
                self.save_status()

    def save_status(self) -> None:
        if self.record:
            self.record["state"] = self.state.run_state()
            self.record["status"] = self.state.status()
            self.history.save(self.record)

    async def wait_done(self, poll: float = 0.2) -> str:
        while True:
            st = self.state.run_state()
            if st in ("succeeded", "failed", "stopped"):
                return st
            await asyncio.sleep(poll)

    async def close(self) -> None:
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


def describe_argv(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
