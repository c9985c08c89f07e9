"""What each CLI verb does. Every verb is an ``async def cmd_<verb>(args) -> exit code``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from inventory.loader import load_inventory
from inventory.model import Inventory
from .cli import (EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UsageError, parse_env,
                  print_json)
from .headless import HeadlessPrinter, summary_table
from .history import History, state_dir
from .link import AgentError
from .run import LaunchSpec, RunController
from .state import kill_summary

DEMO_INVENTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "inventory", "local.yaml")


def make_transport(inv_transport: str, accept_new_host_keys: bool = False):
    if inv_transport == "local":
        from .transport.local import LocalTransport

        return LocalTransport()
    from .transport.ssh import SshTransport

    # RANKDECK_REMOTE_CACHE: where the agent is copied on the hosts (default
    # ~/.cache/rankdeck), for hosts whose home is read-only or shared.
    return SshTransport(accept_new_host_keys=accept_new_host_keys,
                        remote_cache=os.environ.get("RANKDECK_REMOTE_CACHE",
                                                    "~/.cache/rankdeck"))


def resolve_local(inv: Inventory, base: str) -> Inventory:
    """Local hosts: make relative workdirs absolute (the run folders must not move)."""
    if inv.transport == "local":
        for h in inv.hosts:
            h.workdir = os.path.abspath(os.path.join(base, os.path.expanduser(h.workdir)))
    return inv


def script_args(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def wants_tui(args) -> bool:
    return not getattr(args, "no_tui", True) and sys.stdout.isatty()


async def follow(ctl: RunController, args, launch=None, resumed: bool = False) -> int:
    """Show the run (TUI or headless) until it ends or the user detaches. ``launch`` is
    awaited once the view listens (it launches the run, or subscribes to a running one)."""
    if wants_tui(args):
        from .tui.app import run_app

        return await run_app(ctl, launch)
    quiet = {n: l.quiet_until for n, l in ctl.links.items()} if resumed else {}
    printer = HeadlessPrinter(ctl.state, secrets=ctl.secrets, quiet=quiet)
    saved: dict[str, int] = dict(quiet)

    def keep_offsets(node: str) -> None:
        # after the lines are printed: a later `attach --no-tui` goes on from here
        offset = ctl.state.nodes[node].journal_offset
        if offset > saved.get(node, 0):
            saved[node] = offset
            ctl.history.save_offsets(ctl.run_id, saved)
    ctl.state.change_listeners.append(keep_offsets)
    if launch is not None:
        await launch()
    if launch is not None and not resumed:
        print("[rankdeck] run %s started on %d nodes; Ctrl-C detaches, `rankdeck attach %s` "
              "comes back" % (ctl.run_id, len(ctl.links), ctl.run_id), file=printer.out,
              flush=True)
    detach = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, detach.set)
    done = asyncio.ensure_future(ctl.wait_done())
    waiter = asyncio.ensure_future(detach.wait())
    await asyncio.wait([done, waiter], return_when=asyncio.FIRST_COMPLETED)
    loop.remove_signal_handler(signal.SIGINT)
    if not done.done():
        done.cancel()
        waiter.cancel()
        ctl.save_status()
        print("\n[rankdeck] detached; the run goes on. `rankdeck attach %s` to watch it, "
              "`rankdeck stop %s` to stop it." % (ctl.run_id, ctl.run_id), file=sys.stderr)
        await ctl.close()
        return EXIT_OK
    waiter.cancel()
    final = done.result()
    await ctl.stop_store()
    ctl.save_status()
    print(summary_table(ctl.state.status()), file=printer.out)
    await ctl.close()
    return EXIT_OK if final == "succeeded" else EXIT_FAILED


async def start_run(inv: Inventory, spec: LaunchSpec, args, inventory_path: str) -> int:
    transport = make_transport(inv.transport, getattr(args, "accept_new_host_keys", False))
    ctl = RunController(inv, transport, History(), max_restarts=spec.max_restarts)
    ctl.state.stall_min_s = args.stall_after

    async def launch():
        await ctl.launch(spec, allow_partial=getattr(args, "allow_partial", False),
                         inventory_path=inventory_path,
                         preflight=not getattr(args, "skip_preflight", False))

    if getattr(args, "detach", False):
        await launch()
        print(ctl.run_id)
        await ctl.close()
        return EXIT_OK
    return await follow(ctl, args, launch)


async def cmd_launch(args) -> int:
    path = os.path.abspath(args.inventory)
    inv = resolve_local(load_inventory(path), os.getcwd())
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UsageError("--nproc-per-node must be >= 1")
    if args.nnodes is not None:
        parts = args.nnodes.split(":")
        if not all(p.isdigit() for p in parts) or len(parts) > 2:
            raise UsageError("--nnodes %r: write N or MIN:MAX, e.g. --nnodes 2:4" % args.nnodes)
    spec = LaunchSpec(script=args.script, args=script_args(args.args),
                      nproc_per_node=args.nproc_per_node, max_restarts=args.max_restarts,
                      nnodes=args.nnodes, grace=args.grace, metrics_regex=args.metrics_regex,
                      env=parse_env(args.env), module=args.module)
    return await start_run(inv, spec, args, path)


async def cmd_demo(args) -> int:
    inv = load_inventory(DEMO_INVENTORY)
    inv.hosts = inv.hosts[: args.nodes]
    workdir = os.path.join(os.path.dirname(state_dir()), "demo")
    os.makedirs(workdir, exist_ok=True)
    for h in inv.hosts:
        h.workdir = workdir
    import trainer

    script = os.path.join(os.path.dirname(os.path.abspath(trainer.__file__)), "train.py")
    extra = script_args(args.args)
    spec = LaunchSpec(script=script, nproc_per_node=args.nproc_per_node, max_restarts=3,
                      args=["--steps", str(args.steps), "--ckpt-every", "50"] + extra)
    return await start_run(inv, spec, args, DEMO_INVENTORY)


async def open_run(run_id: str, subscribe: bool = True, reconnect: bool = True,
                   resume: bool = False, stall_after: float = 60.0, node: str | None = None):
    """A controller for a recorded run, connected. ``resume``: log lines from where the last
    headless console stopped printing (state and metrics are still read from the start).
    ``node``: a node the caller will act on; an unknown one is refused before connecting."""
    history = History()
    record = history.load(run_id)
    ctl = RunController.from_record(record, make_transport(record.get("transport", "ssh")),
                                    history)
    names = [h.name for h in ctl.inventory.hosts]
    if node is not None and node not in names:
        raise UsageError("run %s has no node %r; nodes: %s" % (ctl.run_id, node,
                                                               ", ".join(names)))
    offsets = history.load_offsets(record["run_id"]) if resume else {}
    ctl.state.stall_min_s = stall_after
    failed = await ctl.connect_all(reconnect=reconnect)
    for name, offset in offsets.items():
        if name in ctl.links:
            ctl.links[name].quiet_until = offset
    if subscribe:
        await ctl.subscribe_all()
    return ctl, failed


def report_unreachable(failed: dict) -> None:
    for name, exc in failed.items():
        print("rankdeck: %s unreachable: %s" % (name, exc), file=sys.stderr)


async def cmd_attach(args) -> int:
    resume = not wants_tui(args)
    ctl, failed = await open_run(args.run_id, subscribe=False, resume=resume,
                                 stall_after=args.stall_after)
    report_unreachable(failed)
    if len(failed) == len(ctl.links):
        await ctl.close()
        return EXIT_UNREACHABLE
    if not resume:  # the TUI starts from the recent lines; scrolling back fetches the rest
        await ctl.recent_lines_only()
    # subscribe only once the view is listening, or the first records go unseen
    return await follow(ctl, args, ctl.subscribe_all, resumed=resume)


async def cmd_status(args) -> int:
    ctl, failed = await open_run(args.run_id, reconnect=False, stall_after=args.stall_after)
    try:
        await ctl.caught_up()
        ctl.state.check_stalls()
        status = ctl.state.status()
        if not failed:
            ctl.save_status()
    finally:
        await ctl.close()
    if args.json:
        print_json(status)
    else:
        report_unreachable(failed)
        print(summary_table(status))
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_logs(args) -> int:
    ctl, failed = await open_run(args.run_id, subscribe=False, reconnect=args.follow,
                                 node=args.node)
    report_unreachable(failed)
    # the printer listens before the subscription, or the first records go unseen
    HeadlessPrinter(ctl.state, rank=args.rank, node=args.node, events=False)
    await ctl.subscribe_all()
    try:
        await ctl.caught_up()
        if args.follow:
            try:
                await ctl.wait_done()
            except asyncio.CancelledError:
                pass
    finally:
        await ctl.close()
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def control(args, verb: str) -> int:
    ctl, failed = await open_run(args.run_id, subscribe=False, reconnect=False,
                                 node=args.node)
    report_unreachable(failed)
    try:
        if verb == "stop":
            results = await ctl.stop(args.node)
        else:
            results = await ctl.restart(args.node)
    finally:
        await ctl.close()
    code = EXIT_UNREACHABLE if failed else EXIT_OK
    for name, res in results.items():
        if isinstance(res, BaseException):
            print("%s: %s" % (name, res), file=sys.stderr)
            code = EXIT_UNREACHABLE if isinstance(res, AgentError) and res.kind == "closed" \
                else EXIT_FAILED
            continue
        if verb == "stop":
            left = res.get("left") or []
            print("%s: %s (%s)" % (name, res.get("state"), kill_summary(res.get("kill") or {})))
            if left:
                print("%s: processes still there: %s" % (name, left), file=sys.stderr)
                code = EXIT_FAILED
        else:
            print("%s: %s (launch %s, restarts %s)" % (name, res.get("state"),
                                                       res.get("launches"), res.get("restarts")))
    return code


async def cmd_stop(args) -> int:
    return await control(args, "stop")


async def cmd_restart(args) -> int:
    return await control(args, "restart")


async def cmd_stacks(args) -> int:
    from .stacks import group, render

    ctl, failed = await open_run(args.run_id, subscribe=False, reconnect=False,
                                 node=args.node)
    report_unreachable(failed)
    names = [args.node] if args.node else [n for n in ctl.links if n not in failed]
    try:
        results = await ctl.stacks(names)
    finally:
        await ctl.close()
    if args.json:
        ranks = [dict(r, node=n) for n, res in results.items()
                 if not isinstance(res, BaseException) for r in res.get("ranks", [])]
        ranks, odd = group(ranks)
        print_json({"ranks": ranks, "odd": odd})
    else:
        print(render(results))
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_check(args) -> int:
    from .preflight import run_check

    return await run_check(args)


async def cmd_ls(args) -> int:
    records = History().list()
    if args.json:
        print_json([{"run_id": r["run_id"], "created": r.get("created"), "state": r.get("state"),
                     "nodes": [h["name"] for h in r.get("hosts", [])],
                     "script": r.get("spec", {}).get("script")} for r in records])
        return EXIT_OK
    if not records:
        print("no runs recorded yet (%s)" % state_dir())
        return EXIT_OK
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("created", 0)))
        print("%-22s %s  %-9s %d nodes  %s" % (r["run_id"], when, r.get("state", "?"),
                                               len(r.get("hosts", [])),
                                               r.get("spec", {}).get("script", "")))
    return EXIT_OK


COMMANDS = {
    "launch": cmd_launch, "demo": cmd_demo, "attach": cmd_attach, "status": cmd_status,
    "logs": cmd_logs, "stop": cmd_stop, "restart": cmd_restart, "check": cmd_check,
    "stacks": cmd_stacks,
    "ls": cmd_ls,
}
