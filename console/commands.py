"""What each CLI verb does. Every verb is an ``async def cmd_<verb>(args) -> exit code``.

A verb builds a RunController (a new run, or a recorded one from History), uses it inside
``async with`` (which closes every connection, never the run: the one owner of its
lifetime), and shows the run in the TUI (console/tui) or headless (console/headless.py),
then leaves it (``RunController.leave``).

Over 450 lines (about 640): every verb's glue, each short. Due a split: the new-run verbs
(launch, submit, demo, check) from the recorded-run verbs, with the helpers they share below
both.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

import trainer
from agent.judge_notify import KINDS as NOTIFY_KINDS
from inventory.loader import load_inventory
from inventory.model import Inventory
from . import slurm, slurm_queued, slurm_stop, slurm_submit
from .actions import action_rows, run_actions
from .cordon import cordon, uncordon, uncordon_refusal, unreachable
from .dryrun import render as render_dry_run
from .errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, LaunchError, UsageError
from .export import RunExport, check_format
from .headless import HeadlessPrinter, SyncProgressLine, journal_ends, run_headless
from .history import History, state_dir
from .hosted_record import known_or_fetched
from .judged import judged, settle
from .launchers import TemplateError
from .liveness import beside_judge, check_stalls
from .preflight import check_table
from .report import RunReport
from .run import LaunchSpec, RunController
from .run_env import launch_secrets
from .sanitize import secret_warnings
from .stacks import group, render
from .summary import control_lines, shown, status_table
from .transport import make_transport
from .transport.base import HostUnreachable
from .verdict import evidence_lines, verdict_lines

DEMO_INVENTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "inventory", "local.yaml")
LOGGED_EVENTS = ("checkpoint", "checkpoint deleted")  # `logs` prints these as [rankdeck] lines
NO_LINES = 1 << 62  # a subscription's quiet_until past any journal: records, no log lines
DEMO_TRAINER = os.path.join(os.path.dirname(os.path.abspath(trainer.__file__)), "train.py")


# -- shared by the verbs -----------------------------------------------------------------------
def parse_env(items: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a dict; UsageError for a malformed one."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise UsageError("--env %r: write KEY=VALUE with KEY a valid variable name" % item)
        env[key] = value
    return env


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


def script_args(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def wants_tui(args) -> bool:
    return not getattr(args, "no_tui", True) and sys.stdout.isatty()


def report_unreachable(failed: dict) -> None:
    for name, exc in failed.items():
        print("rankdeck: %s unreachable: %s" % (name, shown(str(exc))), file=sys.stderr)


def recorded_run(run_id: str, stall_after: float | None = None,
                 node: str | None = None) -> RunController:
    """A controller for a run recorded on this laptop, not connected yet. ``node``: a node the
    caller will act on; an unknown one is refused (UsageError) before connecting."""
    history = History()
    entry = slurm_queued.queued(run_id)
    if entry is not None:
        raise UsageError("run %s has not started: its Slurm job %s waits in the queue; "
                         "`rankdeck status %s` says why, and it or `rankdeck attach %s` "
                         "launches the run once the job runs" % (run_id, entry["job"], run_id,
                                                                run_id))
    record = history.load(run_id)
    ctl = RunController.from_record(record, make_transport(record.get("transport", "ssh")),
                                    history)
    names = [h.name for h in ctl.inventory.hosts]
    if node is not None and node not in names:
        raise UsageError("run %s has no node %r; nodes: %s" % (ctl.run_id, node,
                                                               ", ".join(names)))
    if stall_after is not None:  # else the run's own (RunController.from_record, the judge)
        ctl.state.stall_min_s = stall_after
        ctl.state.stall_min_given = True
    return ctl


async def follow(ctl: RunController, args, launch=None, resumed: bool = False) -> int:
    """Show the run (TUI or headless) until it ends or the user detaches, then leave it
    (its store stopped if it ended, its status saved); the exit code. ``launch`` is awaited
    once the view listens (it launches the run, or subscribes to a running one)."""
    ctl.state.budget.limit = args.line_budget << 20
    ctl.me.attach = True  # listed among the run's consoles (a launch connects after this)
    try:
        if wants_tui(args):
            # Lazy for start-up time: Textual takes about a second to import, and headless
            # runs, scripts and every other verb never need it.
            from .tui.app import run_app

            return await run_app(ctl, launch)
        return await run_headless(ctl, launch, resumed, getattr(args, "by_node", False))
    finally:
        await ctl.leave()


# -- a new run ---------------------------------------------------------------------------------
async def start_run(inv: Inventory, spec: LaunchSpec, args, inventory_path: str) -> int:
    for warning in secret_warnings(launch_secrets(inv, spec.env)):  # before a TUI starts
        print("rankdeck: warning: %s" % warning, file=sys.stderr)
    transport = make_transport(inv.transport, getattr(args, "accept_new_host_keys", False))
    async with RunController(inv, transport, History(), max_restarts=spec.max_restarts,
                             run_id=getattr(args, "run_id_given", None)) as ctl:
        ctl.state.stall_min_s = spec.stall_after
        ctl.mask_env_secrets(spec.env)  # before the view takes the secrets

        async def launch():
            await ctl.launch(spec, allow_partial=getattr(args, "allow_partial", False),
                             inventory_path=inventory_path,
                             preflight=not getattr(args, "skip_preflight", False))

        if getattr(args, "detach", False):
            ctl.sync_listeners.append(SyncProgressLine())
            await launch()
            print(ctl.run_id)
            return EXIT_OK
        return await follow(ctl, args, launch)


async def cmd_launch(args) -> int:
    path = os.path.abspath(args.inventory)
    inv = load_inventory(path).resolve_local(os.getcwd())
    launcher = getattr(args, "launcher", None) or inv.launcher  # the file's, under --slurm too
    if getattr(args, "slurm", None):
        inv = await slurm_inventory(inv, args)
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UsageError("--nproc-per-node must be >= 1")
    if getattr(args, "spares", None):
        mark_spares(inv, args.spares)
    if args.nnodes is not None:
        check_nnodes(args.nnodes, len(inv.active), path)
    spec = LaunchSpec(script=args.script, args=script_args(args.args),
                      nproc_per_node=args.nproc_per_node, max_restarts=args.max_restarts,
                      nnodes=args.nnodes, grace=args.grace, metrics_regex=args.metrics_regex,
                      env=parse_env(args.env), module=args.module,
                      sync=sync_folder(args.sync, inv.sync, path),
                      sync_include=list(args.sync_include),
                      checkpoint_dir=args.checkpoint_dir,
                      **slurm_limit(args),
                      launch_with=launcher,
                      **judge_settings(args, inv))
    if spec.auto_cordon and (spec.launch_with != "torchrun" or spec.launcher):
        # the judge starts a spare from a command made at launch: only torchrun's
        # rendezvous gives it a node rank then (the others fix each node's at launch)
        raise UsageError("--auto-cordon: the judge puts a spare in with torchrun's "
                         "rendezvous only; launcher %s fixes each node's rank at launch: "
                         "cordon with `rankdeck cordon` instead" % spec.launch_with)
    try:  # the template check, before anything is started (console/launchers.py)
        shown = render_dry_run(inv, spec)
    except TemplateError as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "dry_run", False):
        print(shown)
        return EXIT_OK
    return await start_run(inv, spec, args, path)


async def slurm_inventory(inv: Inventory, args) -> Inventory:
    """``launch --slurm``: the job's nodes as the run's hosts (console/slurm.py)."""
    job = slurm.job_from_env(args.slurm)
    transport = make_transport(slurm.TRANSPORT_PREFIX + job,
                               getattr(args, "accept_new_host_keys", False))
    try:
        run_inv = await slurm.job_inventory(inv, job, transport)
        warning = await slurm.site_warning(transport, slurm.login_host(inv))
        if warning:
            print("rankdeck: warning: %s" % warning, file=sys.stderr)
        return run_inv
    except HostUnreachable as exc:
        raise LaunchError("cannot reach the login host: %s" % exc, EXIT_UNREACHABLE) from None
    finally:
        await transport.close()


def slurm_limit(args) -> dict:
    """``--signal-before``/``--requeue`` as LaunchSpec fields; on Slurm runs only."""
    before, requeue = getattr(args, "signal_before", None), getattr(args, "requeue", False)
    if (before is not None or requeue) and not getattr(args, "slurm", None):
        raise UsageError("--signal-before and --requeue act on a Slurm job's time limit: use "
                         "them with launch --slurm or submit (docs/SLURM.md)")
    if requeue and before is None:
        before = 120.0
    return {"signal_before": before, "requeue": requeue}


def mark_spares(inv: Inventory, names: str) -> None:
    """``launch --spares node4,node5``: those hosts of the inventory wait as spares."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in {h.name for h in inv.hosts}]
    if unknown:
        raise UsageError("--spares: no host %s in %s; hosts: %s" % (
            ", ".join(unknown), inv.path, ", ".join(h.name for h in inv.hosts)))
    inv.mark_spares(wanted)
    if not inv.active:
        raise UsageError("--spares %s leaves no host to train on" % names)


async def cmd_submit(args) -> int:
    """`rankdeck submit`: a batch job that holds the nodes, followed while it is pending, then a
    run in it as `launch --slurm` (console/slurm_submit.py); the job ends with the run."""
    script = slurm_submit.batch_script(args.nodes, args.time, args.partition,
                                       args.gpus_per_node, args.requeue)
    if args.dry_run:
        print(script, end="")
        return EXIT_OK
    path = os.path.abspath(args.inventory)
    login = slurm.login_host(load_inventory(path))
    transport = make_transport(slurm.TRANSPORT_PREFIX + "0",
                               getattr(args, "accept_new_host_keys", False))
    job, launched = None, False
    try:
        job = await slurm_submit.submit(transport, login, script)
        say = lambda line: print("rankdeck: " + line, file=sys.stderr, flush=True)  # noqa: E731
        say("submitted Slurm job %s (%d nodes, --time %s)" % (job, args.nodes, args.time))
        if args.detach and slurm_queued.keepable(args, load_inventory(path)):
            now = await slurm.job_now(transport, login, job)
            if now["state"] != "RUNNING":  # the run id now; the launch at its next status
                run_id = slurm_queued.keep(args, job, script, path)
                pid = slurm_queued.start_follower(run_id)
                say("%s; a follower on this machine (pid %d) launches the run when it runs; "
                    "should it be gone, `rankdeck status %s` (or attach) does"
                    % (slurm_submit.pending_line(now), pid, run_id))
                print(run_id)
                launched = True
                return EXIT_OK
        await slurm_submit.wait_running(transport, login, job, say)
        args.slurm = job
        code = await cmd_launch(args)
        launched = True
    except HostUnreachable as exc:
        raise LaunchError("cannot reach the login host: %s" % exc, EXIT_UNREACHABLE) from None
    finally:
        if job is not None and not (launched and getattr(args, "detach", False)):
            print("rankdeck: " + await slurm_submit.cancel(transport, login, job),
                  file=sys.stderr)  # the run it held is over, or never started
        await transport.close()
    if launched:
        slurm_queued.mark_submitted(job, script)
    return code


def judge_settings(args, inv: Inventory) -> dict:
    """The run's own settings the judge on the hosts applies (LaunchSpec's judge fields)."""
    kinds = None
    if getattr(args, "notify_on", None):
        kinds = [k.strip() for k in args.notify_on.split(",") if k.strip()]
        unknown = sorted(set(kinds) - set(NOTIFY_KINDS))
        if unknown:
            raise UsageError("--notify-on: unknown kind(s) %s; choose from %s"
                             % (", ".join(unknown), ", ".join(NOTIFY_KINDS)))
    return {"stall_after": args.stall_after or 60.0,
            "on_hang": getattr(args, "on_hang", "warn"),
            "on_nan": getattr(args, "on_nan", "warn"),
            "max_wall": getattr(args, "max_wall", None),
            "notify": getattr(args, "notify", None) or getattr(inv, "notify", None),
            "notify_on": kinds,
            "auto_cordon": bool(getattr(args, "auto_cordon", False)),
            "cordon_within": getattr(args, "cordon_within", 600.0)}


def check_nnodes(nnodes: str, hosts: int, inventory: str) -> None:
    """``--nnodes`` N or MIN:MAX must fit the inventory: rankdeck starts one node on each of
    its ``hosts`` hosts, so N must be that count, and MIN <= hosts <= MAX. UsageError with
    the fix otherwise."""
    parts = nnodes.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 2:
        raise UsageError("--nnodes %r: write N or MIN:MAX, e.g. --nnodes 2:4" % nnodes)
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise UsageError("--nnodes %s: a run needs at least 1 node" % nnodes)
    if low > high:
        raise UsageError("--nnodes %s: MIN is above MAX; write MIN:MAX, e.g. --nnodes %d:%d"
                         % (nnodes, high, low))
    where = "the inventory %s has %d host%s and rankdeck starts one node on each" % (
        inventory, hosts, "" if hosts == 1 else "s")
    if len(parts) == 1 and low != hosts:
        raise UsageError("--nnodes %s asks for %s nodes than there are hosts: %s; use "
                         "--nnodes %d, %s" % (
                             nnodes, "more" if low > hosts else "fewer", where, hosts,
                             "or add hosts to the inventory" if low > hosts else
                             "an elastic --nnodes %d:%d, or an inventory of %d hosts"
                             % (low, hosts, low)))
    if low > hosts:
        raise UsageError("--nnodes %s needs at least %d nodes, more than there are hosts: %s; "
                         "use --nnodes %d:%d or add hosts to the inventory"
                         % (nnodes, low, where, min(hosts, high), max(hosts, high)))
    if hosts > high:
        raise UsageError("--nnodes %s allows at most %d nodes, fewer than there are hosts: %s; "
                         "use --nnodes %d:%d or an inventory of %d hosts"
                         % (nnodes, high, where, low, hosts, high))


def sync_folder(given: str | None, from_inventory: str | None, inventory: str) -> str | None:
    """The folder to send (``--sync DIR``, else the inventory's ``defaults.sync``), absolute;
    UsageError when it is not a folder on this machine."""
    folder = given or from_inventory
    if folder is None:
        return None
    folder = os.path.abspath(os.path.expanduser(folder))
    if not os.path.isdir(folder):
        said = "--sync %s" % given if given else "defaults.sync in %s (%s)" % (inventory, folder)
        raise UsageError("%s: not a folder on this machine; give the folder that holds your "
                         "training code" % said)
    return folder


async def cmd_demo(args) -> int:
    inv = load_inventory(DEMO_INVENTORY)
    inv.hosts = inv.hosts[: args.nodes]
    workdir = os.path.join(os.path.dirname(state_dir()), "demo")
    os.makedirs(workdir, exist_ok=True)
    for h in inv.hosts:
        h.workdir = workdir
    extra = script_args(args.args)
    spec = LaunchSpec(script=DEMO_TRAINER, nproc_per_node=args.nproc_per_node, max_restarts=3,
                      args=["--steps", str(args.steps), "--ckpt-every", "50"] + extra,
                      stall_after=args.stall_after or 60.0)
    return await start_run(inv, spec, args, DEMO_INVENTORY)


async def cmd_check(args) -> int:
    """`rankdeck check -i INVENTORY [--json]`: 0 all good, 1 problems, 3 unreachable hosts."""
    inv = load_inventory(os.path.abspath(args.inventory)).resolve_local(os.getcwd())
    async with RunController(inv, make_transport(inv.transport,
                                                 args.accept_new_host_keys)) as ctl:
        failed = await ctl.connect_all(reconnect=False)
        checks = await ctl.preflight(failed=failed)
    if args.json:
        print_json([dict(asdict(c), ok=c.ok) for c in checks])
    else:
        print(check_table(checks))
    if failed:
        return EXIT_UNREACHABLE
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED


# -- a recorded run ----------------------------------------------------------------------------
async def cmd_attach(args) -> int:
    tui = wants_tui(args)
    if await slurm_queued.follow(args.run_id, cmd_launch, wait=True) is not None:
        raise LaunchError("the Slurm job of run %s ended before it ran" % args.run_id,
                          EXIT_FAILED)
    await known_or_fetched(args.run_id, args.inventory, args.accept_new_host_keys)
    async with recorded_run(args.run_id, args.stall_after) as ctl:
        # said in every connection's hello: the agents list this console, and refuse a
        # read-only one every change (docs/SECURITY.md, "Read-only consoles")
        ctl.me.read_only, ctl.me.attach = getattr(args, "read_only", False), True
        failed = await ctl.connect_all()
        report_unreachable(failed)
        if len(failed) == len(ctl.links):
            return EXIT_UNREACHABLE
        if tui:  # the TUI starts from the recent lines; scrolling back fetches the rest
            await ctl.recent_lines_only()
        else:  # headless: lines from where the last headless console stopped printing
            for name, offset in ctl.history.load_offsets(ctl.run_id).items():
                if name in ctl.links:
                    ctl.links[name].quiet_until = offset
        # subscribe only once the view is listening, or the first records go unseen
        return await follow(ctl, args, ctl.subscribe_all, resumed=not tui)


async def cmd_watch(args) -> int:
    """`rankdeck watch RUN`: ``attach --read-only``."""
    args.read_only = True
    return await cmd_attach(args)


async def cmd_actions(args) -> int:
    """`rankdeck actions RUN [--json]`: who changed the run (console/actions.py)."""
    async with recorded_run(args.run_id) as ctl:
        actions, failed = await run_actions(ctl)
    report_unreachable(failed)
    if args.json:
        print_json(actions)
    else:
        print("\n".join(action_rows(actions, ctl.state.masker)))
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_status(args) -> int:
    queued = await slurm_queued.follow(args.run_id, cmd_launch)
    if queued is not None:  # submit --detach's job still waits (console/slurm_queued.py)
        if args.json:
            print_json(queued)
        else:
            print("run %s %s: %s" % (queued["run_id"], queued["state"],
                                     queued["slurm"]["pending"]))
        return EXIT_OK
    async with recorded_run(args.run_id, args.stall_after) as ctl:
        failed = await ctl.connect_all(reconnect=False)
        await ctl.subscribe_all()
        await ctl.caught_up()
        if judged(ctl.state):  # the judge's journal said who is stalled
            settle(ctl.state)
            beside_judge(ctl.state)  # the rules an older judge does not apply
        else:
            check_stalls(ctl.state)
        status = ctl.status()
        job = slurm.job_of(ctl.record.get("transport", ""))
        if job:  # the job now: its state, time left; a run it outlived ended with it
            now, words = await slurm.job_and_nodes(ctl.transport, ctl.inventory.hosts, job)
            status = slurm.with_nodes(slurm.with_job(status, now, getattr(ctl.spec, "requeue",
                                                                          False)), words)
        if not failed:
            ctl.save_status()
    ended = (status.get("slurm") or {}).get("ended")
    if args.json:
        print_json(status)
    else:
        report_unreachable(failed)
        print(status_table(status))
        if ended:
            print("%s: the run ended with it (%s)" % (ended, status["state"]))
        for node, words in ((status.get("slurm") or {}).get("nodes") or {}).items():
            print("%s: Slurm says %s" % (node, words))
    if ended and failed:  # its nodes are out of reach with it: no more to say
        return EXIT_FAILED
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_export(args) -> int:
    """`rankdeck export RUN --format jsonl|csv [--out DIR]`: per rank metrics, per node
    telemetry, replayed from the nodes' journals (console/export.py)."""
    check_format(args.format)
    async with recorded_run(args.run_id) as ctl:
        export = RunExport(ctl.state)
        failed = await replay_records(ctl)
    for path in export.write(args.out, args.format):
        print(path)
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_report(args) -> int:
    """`rankdeck report RUN [--out DIR]`: one Markdown page and a loss SVG (console/report.py)."""
    async with recorded_run(args.run_id) as ctl:
        failed = await replay_records(ctl)
        paths = RunReport(ctl.state).write(args.out)
    for path in paths:
        print(path)
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def replay_records(ctl: RunController) -> list:
    """Every node's journal replayed into ctl.state without its log lines; the unreachable."""
    failed = await ctl.connect_all(reconnect=False)
    report_unreachable(failed)
    for link in ctl.links.values():
        link.quiet_until = NO_LINES  # metrics, telemetry, events only: no log line is sent
    await ctl.subscribe_all()
    await ctl.caught_up()
    return failed


async def cmd_logs(args) -> int:
    async with recorded_run(args.run_id, node=args.node) as ctl:
        failed = await ctl.connect_all(reconnect=args.follow)
        report_unreachable(failed)
        # the printer listens before the subscription, or the first records go unseen
        printer = HeadlessPrinter(ctl.state, secrets=ctl.secrets, rank=args.rank,
                                  node=args.node, events=LOGGED_EVENTS)
        printer.in_time_order(await journal_ends(ctl), args.by_node)
        await ctl.subscribe_all()
        await ctl.caught_up()
        printer.release()
        if args.follow:
            await ctl.wait_done()
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def control(args, verb: str) -> int:
    """Stop or restart a recorded run (or one node of it) and say what each node did."""
    async with recorded_run(args.run_id, node=args.node) as ctl:
        if verb == "restart":  # a secret this shell lacks: refuse before touching a node
            ctl.check_restartable(args.node)
            if ctl.static_world():  # `restart --node N` restarts them all: said first
                print("%s, on a fresh master port%s" % (
                    ctl.static_world(), " (not %s alone)" % args.node if args.node else ""))
        failed = await ctl.connect_all(reconnect=False)
        report_unreachable(failed)
        results = await (ctl.stop(args.node) if verb == "stop" else ctl.restart(args.node))
    code = EXIT_UNREACHABLE if failed else EXIT_OK
    for line in control_lines(verb, results):
        print(line.text, file=sys.stderr if line.problem else sys.stdout)
        if line.problem:
            code = EXIT_UNREACHABLE if line.problem == "unreachable" else EXIT_FAILED
    return code


async def cmd_stop(args) -> int:
    said = await slurm_queued.stop(args.run_id)
    if said:  # submit --detach's job still in the queue: the run never started
        print(said)
        return EXIT_OK
    record = History().load(args.run_id)
    if not args.node:  # a Slurm run's job back in the queue: no node to reach (slurm_stop.py)
        queued = await slurm_stop.stop_queued(record)
        if queued is not None:
            return queued
    code = await control(args, "stop")
    if slurm.job_of(record.get("transport", "")) and not args.node and code == EXIT_OK:
        code = await slurm_stop.after_stop(record)
    return code


async def cmd_restart(args) -> int:
    return await control(args, "restart")


async def cmd_cordon(args) -> int:
    """`rankdeck cordon RUN --node N [--replace-with S] [--yes]`: the preview, then (asked,
    or --yes) the surgery (console/cordon.py). 0 done, 1 it failed, 2 refused or not
    confirmed, 3 a node it needs cannot be reached."""
    async with recorded_run(args.run_id, node=args.node) as ctl:
        failed = await replay_records(ctl)  # ranks and checkpoints for the preview
        plan = ctl.cordon_plan(args.node, args.replace_with)
        print("\n".join(plan.lines()))
        if plan.refusal:
            return EXIT_USAGE
        away = unreachable(ctl, plan)
        if away:
            print("rankdeck: " + away, file=sys.stderr)
            return EXIT_UNREACHABLE
        if not confirmed(args.yes, "cordon %s?" % plan.node):
            return EXIT_USAGE
        entry = await cordon(ctl, plan)
    print("%s: %s" % (entry["what"], entry["outcome"]))
    return EXIT_OK if entry["outcome"] == "done" else EXIT_FAILED


async def cmd_uncordon(args) -> int:
    """`rankdeck uncordon RUN --node N`: a cordoned node becomes a spare again."""
    async with recorded_run(args.run_id, node=args.node) as ctl:
        refusal = uncordon_refusal(ctl, args.node)
        if refusal:
            raise UsageError(refusal)
        failed = await ctl.connect_all(reconnect=False)
        if args.node in failed:
            report_unreachable(failed)
            return EXIT_UNREACHABLE
        entry = await uncordon(ctl, args.node)
    print("%s: %s" % (entry["what"], entry["outcome"]))
    return EXIT_OK if entry["outcome"] == "done" else EXIT_FAILED


def confirmed(yes: bool, question: str) -> bool:
    """--yes, or ``y`` typed at the question; without a terminal to ask, no (says why)."""
    if yes:
        return True
    if not sys.stdin.isatty():
        print("rankdeck: not confirmed: pass --yes to do it without a question",
              file=sys.stderr)
        return False
    try:
        answer = input("%s [y/N] " % question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


async def cmd_stacks(args) -> int:
    async with recorded_run(args.run_id, node=args.node) as ctl:
        failed = await ctl.connect_all(reconnect=False)
        report_unreachable(failed)
        names = [args.node] if args.node else [n for n in ctl.links if n not in failed]
        results = await ctl.stacks(names)
    if args.json:
        ranks = [dict(r, node=n) for n, res in results.items()
                 if not isinstance(res, BaseException) for r in res.get("ranks", [])]
        ranks, odd = group(ranks)
        print_json({"ranks": ranks, "odd": odd})
    else:
        print(render(results))
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_why(args) -> int:
    async with recorded_run(args.run_id) as ctl:
        failed = await ctl.connect_all(reconnect=False)
        report_unreachable(failed)
        verdict = await ctl.why()
    if args.json:
        print_json(verdict)
    else:
        print("\n".join(verdict_lines(verdict) + ["  " + line for line in evidence_lines(verdict)]))
    return EXIT_OK


# -- this laptop -------------------------------------------------------------------------------
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
    "launch": cmd_launch, "demo": cmd_demo, "check": cmd_check, "attach": cmd_attach,
    "status": cmd_status, "export": cmd_export, "report": cmd_report, "logs": cmd_logs, "stop": cmd_stop,
    "restart": cmd_restart, "cordon": cmd_cordon, "uncordon": cmd_uncordon,
    "submit": cmd_submit,
    "stacks": cmd_stacks, "why": cmd_why, "ls": cmd_ls,
    "watch": cmd_watch, "actions": cmd_actions,
}
