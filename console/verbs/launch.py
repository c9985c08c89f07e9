"""The verbs that start a new run: launch (``--slurm`` in a job's nodes), submit (a batch job,
then a launch in it), demo (the reference trainer on this laptop) and check (the inventory's
preflight, before a launch). A run started is followed (console/verbs/output.py) or, with
``--detach``, left running with its id printed."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict

import trainer
from inventory.loader import load_inventory
from inventory.model import Inventory
from ..slurm import slurm, queued as slurm_queued, submit as slurm_submit
from ..launch.dryrun import render as render_dry_run
from ..errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, LaunchError, UsageError
from .headless import SyncProgressLine
from ..records.history import History, state_dir
from ..launch.options import (
    check_nnodes, judge_settings, mark_spares, parse_env, script_args, slurm_limit, sync_folder
)
from ..launch.launchers import TemplateError
from ..run.preflight import check_table
from ..run.deep import deep_check, deep_table, report as deep_report
from ..run.run import LaunchSpec, RunController
from ..launch.env import launch_secrets
from ..model.state import RUN_ENDED
from ..lines.sanitize import secret_warnings
from ..transport import make_transport
from ..transport.base import HostUnreachable
from . import hosts as hosts_verb
from .output import follow, print_json

# console/verbs/launch.py -> the checkout's inventory/local.yaml
DEMO_INVENTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "inventory", "local.yaml")
DEMO_TRAINER = os.path.join(os.path.dirname(os.path.abspath(trainer.__file__)), "train.py")


async def start_run(inv: Inventory, spec: LaunchSpec, args, inventory_path: str) -> int:
    secrets = launch_secrets(inv, spec.env)
    warnings = secret_warnings(secrets)
    if slurm.job_of(inv.transport or "") and not getattr(args, "submitted", False):
        warnings.append(slurm.clear_text_warning(secrets))  # (submit said it before sbatch)
    for warning in filter(None, warnings):  # before a TUI starts, before anything is sent
        print("rankdeck: warning: %s" % warning, file=sys.stderr)
    transport = make_transport(inv.transport, getattr(args, "accept_new_host_keys", False))
    async with RunController(inv, transport, History(), max_restarts=spec.max_restarts,
                             run_id=getattr(args, "run_id_given", None)) as ctl:
        ctl.state.stall_min_s = spec.stall_after
        ctl.mask_env_secrets(spec.env)  # before the view takes the secrets

        async def launch():
            await ctl.launch(spec, allow_partial=getattr(args, "allow_partial", False),
                             inventory_path=inventory_path,
                             preflight=False if getattr(args, "skip_preflight", False)
                             else "deep" if getattr(args, "preflight", "") == "deep"
                             else True)

        if getattr(args, "detach", False):
            ctl.sync_listeners.append(SyncProgressLine())
            await launch()
            print(ctl.run_id)
            return EXIT_OK
        code = await follow(ctl, args, launch)
        # detached from the view (`q`, Ctrl-C): a submit's job stays for the run it holds
        args.left_running = ctl.launch_error is None and \
            ctl.state.run_state() not in RUN_ENDED
        return code


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
    if not getattr(args, "slurm", None) and not getattr(args, "dry_run", False):
        inv = await hosts_verb.flags_at_launch(inv, args)  # a flagged host: warned, swapped
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
                      flagged=getattr(args, "flagged_hosts", None) or None,
                      **judge_settings(args, inv))
    if spec.auto_cordon and (spec.launch_with != "torchrun" or spec.launcher):
        # the judge starts a spare from a command made at launch: only torchrun's
        # rendezvous gives it a node rank then (the others fix each node's at launch)
        raise UsageError("--auto-cordon: the judge puts a spare in with torchrun's "
                         "rendezvous only; launcher %s fixes each node's rank at launch: "
                         "cordon with `rankdeck cordon` instead" % spec.launch_with)
    try:  # the template check, before anything is started (console/launch/launchers.py)
        shown = render_dry_run(inv, spec)
    except TemplateError as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "dry_run", False):
        print(shown)
        return EXIT_OK
    return await start_run(inv, spec, args, path)


async def slurm_inventory(inv: Inventory, args) -> Inventory:
    """``launch --slurm``: the job's nodes as the run's hosts (console/slurm/slurm.py)."""
    job = slurm.job_from_env(args.slurm)
    transport = make_transport(slurm.TRANSPORT_PREFIX + job,
                               getattr(args, "accept_new_host_keys", False))
    try:
        run_inv = await slurm.job_inventory(inv, job, transport)
        warning = await slurm.site_warning(transport, slurm.login_host(inv))
        refusal = slurm.requeue_refusal(args)
        if warning and refusal:
            raise UsageError(refusal)
        if warning:
            print("rankdeck: warning: %s" % warning, file=sys.stderr)
        return run_inv
    except HostUnreachable as exc:
        raise LaunchError("cannot reach the login host: %s" % exc, EXIT_UNREACHABLE) from None
    finally:
        await transport.close()


async def cmd_submit(args) -> int:
    """`rankdeck submit`: a batch job that holds the nodes, followed while it is pending, then a
    run in it as `launch --slurm` (console/slurm/submit.py); the job ends with the run."""
    script = slurm_submit.batch_script(args.nodes, args.time, args.partition,
                                       args.gpus_per_node, args.requeue)
    args.submitted = True  # the run's judge ends the job with the run (kept for a follower)
    if args.dry_run:
        print(script, end="")
        return EXIT_OK
    path = os.path.abspath(args.inventory)
    login_inv = load_inventory(path)
    login = slurm.login_host(login_inv)
    warning = slurm.clear_text_warning(launch_secrets(login_inv, parse_env(args.env)))
    if warning:  # the nodes take the login host's env (console/slurm/slurm.py job_inventory)
        print("rankdeck: warning: %s" % warning, file=sys.stderr)
    transport = make_transport(slurm.TRANSPORT_PREFIX + "0",
                               getattr(args, "accept_new_host_keys", False))
    job, launched = None, False
    try:
        refusal = slurm.requeue_refusal(args)
        if refusal and await slurm.site_warning(transport, login):
            raise UsageError(refusal)  # before anything is submitted
        job = await slurm_submit.submit(transport, login, script)
        say = lambda line: print("rankdeck: " + line, file=sys.stderr, flush=True)  # noqa: E731
        say("submitted Slurm job %s (%d nodes, --time %s)" % (job, args.nodes, args.time))
        if args.detach:
            now = await slurm.job_now(transport, login, job)
            if now["state"] != "RUNNING":  # the run id now; the launch at its next status
                run_id = slurm_queued.keep(args, job, script, path)
                pid = slurm_queued.start_follower(run_id, parse_env(args.env))
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
        left = launched and getattr(args, "left_running", False)  # detached from the view
        if job is not None and not (launched and getattr(args, "detach", False) or left):
            print("rankdeck: " + await slurm_submit.cancel(transport, login, job),
                  file=sys.stderr)  # the run it held is over, or never started
        elif job is not None and left:
            print("rankdeck: Slurm job %s holds the run on: its judge ends the job when the "
                  "run is over (`rankdeck stop` cancels it now)" % job, file=sys.stderr)
        await transport.close()
    if launched:
        slurm_queued.mark_submitted(job, script)
    return code


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
    """`rankdeck check -i INVENTORY [--deep] [--json]`: 0 all good, 1 problems (with
    ``--deep``: suspects), 3 unreachable hosts."""
    inv = load_inventory(os.path.abspath(args.inventory)).resolve_local(os.getcwd())
    async with RunController(inv, make_transport(inv.transport,
                                                 args.accept_new_host_keys)) as ctl:
        failed = await ctl.connect_all(reconnect=False)
        if getattr(args, "deep", False):
            checks, net = await deep_check(ctl, failed, getattr(args, "checkpoint_dir", None))
        else:
            checks = await ctl.preflight(failed=failed)
    if getattr(args, "deep", False):
        if args.json:
            print_json(deep_report(checks, net))
        else:
            print(deep_table(checks, net))
    elif args.json:
        print_json([dict(asdict(c), ok=c.ok) for c in checks])
    else:
        print(check_table(checks))
    if failed:
        return EXIT_UNREACHABLE
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
