"""The verbs on a run recorded on this laptop: attach and watch (followed in a view), status,
logs, report, actions, stacks and why (read from its nodes), stop, restart, cordon and
uncordon (change it), goodput (where its time went), and ls (the runs recorded here). Each
builds the run's RunController from History (:func:`recorded_run`); a run whose Slurm job
still waits in the queue is launched by status or attach once the job runs
(console/slurm/queued.py). `export` is console/verbs/export.py."""

from __future__ import annotations

import sys
import time

from ..slurm import slurm, queued as slurm_queued, stop as slurm_stop
from ..records.actions import action_rows, run_actions
from ..surgery.cordon import cordon, uncordon, uncordon_refusal, unreachable
from ..errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, LaunchError, UsageError
from .headless import HeadlessPrinter, journal_ends
from ..records.history import History, seen_text, state_dir
from ..run.hosted_record import known_or_fetched
from ..judgement.judged import judged, settle
from .launch import cmd_launch
from ..judgement.local_judge import beside_judge, check_stalls
from ..records.goodput import from_judge, goodput_lines, header_piece
from ..records.report import RunReport
from ..launch.dryrun import recorded_lines
from ..run.judge import judges_goodput
from ..run.run import RunController
from ..judgement.stacks import group, render
from ..model.summary import control_lines, shown, status_table
from ..transport import make_transport
from .output import follow, print_json, wants_tui
from ..judgement.verdict import evidence_lines, verdict_lines

LOGGED_EVENTS = ("checkpoint", "checkpoint deleted")  # `logs` prints these as [rankdeck] lines
NO_LINES = 1 << 62  # a subscription's quiet_until past any journal: records, no log lines


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
    """`rankdeck actions RUN [--json]`: who changed the run (console/records/actions.py)."""
    async with recorded_run(args.run_id) as ctl:
        actions, failed, notes = await run_actions(ctl)
    report_unreachable(failed)
    for note in notes:  # what the list leaves out (a capped list, a node's rotated log)
        print("rankdeck: %s" % shown(note), file=sys.stderr)
    if args.json:
        print_json(actions)
    else:
        print("\n".join(action_rows(actions, ctl.state.masker)))
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_status(args) -> int:
    queued = await slurm_queued.follow(args.run_id, cmd_launch)
    if queued is not None:  # submit --detach's job still waits (console/slurm/queued.py)
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
        judges = from_judge(await judges_goodput(ctl))  # the judge's own figures when fresh
        status["goodput"] = judges or dict(status["goodput"], source="journals")
        job = slurm.job_of(ctl.record.get("transport", ""))
        if job:  # the job now: its state, time left; a run it outlived ended with it
            now, words = await slurm.job_and_nodes(ctl.transport, ctl.inventory.hosts, job)
            status = slurm.with_nodes(slurm.with_job(
                status, now, getattr(ctl.spec, "requeue", False),
                bool(ctl.record.get("slurm_submitted"))), words)
        if not failed:
            ctl.save_status()
    ended = (status.get("slurm") or {}).get("ended")
    if args.json:
        print_json(status)
    else:
        report_unreachable(failed)
        print(status_table(status))
        good = header_piece(status["goodput"])
        if good:  # and the GPU-hours a node lost now would cost (docs/GOODPUT.md)
            print(good)
        if ended:
            print("%s: the run ended with it (%s)" % (ended, status["state"]))
        for node, words in ((status.get("slurm") or {}).get("nodes") or {}).items():
            print("%s: Slurm says %s" % (node, words))
    if ended and failed:  # its nodes are out of reach with it: no more to say
        return EXIT_OK if status["state"] == "succeeded" else EXIT_FAILED
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_report(args) -> int:
    """`rankdeck report RUN [--out DIR]`: one Markdown page and a loss SVG (console/records/report.py)."""
    async with recorded_run(args.run_id) as ctl:
        failed = await replay_records(ctl)
        paths = RunReport(ctl.state).write(args.out)
    for path in paths:
        print(path)
    return EXIT_UNREACHABLE if failed else EXIT_OK


async def cmd_goodput(args) -> int:
    """`rankdeck goodput RUN [--json]`: where the run's time went and what each incident cost:
    the report the run's judge keeps (agent/judge/goodput.py) while it is fresh, else from its
    journals replayed here (agent/rules/goodput.py; console/records/goodput.py says it)."""
    failed: list = []
    async with recorded_run(args.run_id) as ctl:
        # the judge's own report when it is fresh: one small answer, no replay (docs/GOODPUT.md)
        report = from_judge(await judges_goodput(ctl))
        if report is None:
            failed = await replay_records(ctl)
            report = dict(ctl.state.goodput.report(time.time()), source="journals")
    if args.json:
        print_json(report)
    else:
        print("\n".join(goodput_lines(report)))
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


def foreign_command(ctl, names: list[str] | None, yes: bool) -> bool:
    """A run whose record came from one of its hosts (`watch -i`, console/run/hosted_record.py):
    the command a verb that drives it would start there, shown, then asked (or --yes); True
    to go on. A record launched from this laptop: True, nothing shown."""
    source = ctl.record.get("copied_from")
    if not isinstance(source, str):
        return True
    for line in recorded_lines(ctl.inventory, ctl.spec, ctl.state.masker, source, names):
        print(shown(line), file=sys.stderr)
    return confirmed(yes, "run it?")


async def control(args, verb: str) -> int:
    """Stop or restart a recorded run (or one node of it) and say what each node did."""
    async with recorded_run(args.run_id, node=args.node) as ctl:
        if verb == "restart":  # a secret this shell lacks: refuse before touching a node
            ctl.check_restartable(args.node)
            if ctl.static_world():  # `restart --node N` restarts them all: said first
                print("%s, on a fresh master port%s" % (
                    ctl.static_world(), " (not %s alone)" % args.node if args.node else ""))
            if not foreign_command(ctl, [args.node] if args.node and not ctl.static_world()
                                   else None, getattr(args, "yes", False)):
                return EXIT_USAGE
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
    or --yes) the surgery (console/surgery/cordon.py). 0 done, 1 it failed, 2 refused or not
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
        if not foreign_command(ctl, None, args.yes) or \
                not confirmed(args.yes, "cordon %s?" % plan.node):
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
        if not foreign_command(ctl, [args.node], getattr(args, "yes", False)):
            return EXIT_USAGE
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
                     "updated": r.get("updated"),
                     "nodes": [h["name"] for h in r.get("hosts", [])],
                     "script": r.get("spec", {}).get("script")} for r in records])
        return EXIT_OK
    if not records:
        print("no runs recorded yet (%s)" % state_dir())
        return EXIT_OK
    now = time.time()
    for r in records:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.get("created", 0)))
        print("%-22s %s  %-9s %-16s %d nodes  %s" % (
            r["run_id"], when, shown(str(r.get("state", "?"))), "(%s)" % seen_text(r, now),
            len(r.get("hosts", [])), shown(str(r.get("spec", {}).get("script", "")))))
    return EXIT_OK
