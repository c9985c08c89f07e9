"""`rankdeck export RUN`: a run's numbers as files (JSON lines, CSV, TensorBoard), or into an
experiment tracker (``--format mlflow|wandb``, docs/EXPORTS.md), once or, with ``--follow``,
while the run lives.

Every node's journal is replayed into the run's RunState without its log lines (as `report`
and `status` do); :class:`console.records.export.RunExport` keeps the rows, and for a tracker
:class:`console.records.tracked.Cursor` hands out what came since the last push: ``--follow``
pushes what is new every FOLLOW_EVERY seconds until the run ends, then the run's report, and
ends the tracker's run with the run's end state.
"""

from __future__ import annotations

import asyncio
import sys

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UsageError
from ..records.export import RunExport, check_format
from ..records.report import RunReport
from ..records.tracked import Cursor, params, tags
from ..model.summary import shown
from .recorded import NO_LINES, recorded_run, replay_records, report_unreachable

TRACKERS = ("mlflow", "wandb")
FOLLOW_EVERY = 5.0  # seconds between two pushes while --follow follows a live run
NAMES = {"mlflow": "MLflow", "wandb": "W&B"}


async def cmd_export(args) -> int:
    """`rankdeck export RUN --format jsonl|csv|tensorboard [--out DIR]`: files;
    ``--format mlflow|wandb [--follow]``: a tracker's run (exit 1 when the tracker refused)."""
    check_format(args.format)  # a missing optional package: exit 2, nothing connected
    if args.format not in TRACKERS:
        if args.follow:
            raise UsageError("--follow is for --format mlflow or wandb")
        async with recorded_run(args.run_id) as ctl:
            export = RunExport(ctl.state)
            failed = await replay_records(ctl)
        for path in export.write(args.out, args.format):
            print(path)
        return EXIT_UNREACHABLE if failed else EXIT_OK
    async with recorded_run(args.run_id) as ctl:
        export = RunExport(ctl.state)
        cursor = Cursor(export, ctl.record.get("created") or ctl.state.started)
        failed = await ctl.connect_all(reconnect=args.follow)
        report_unreachable(failed)
        for link in ctl.links.values():
            link.quiet_until = NO_LINES  # metrics, telemetry, events only: no log line is sent
        if len(failed) == len(ctl.links):  # nothing to export: no tracker's run is made
            return EXIT_UNREACHABLE
        await ctl.subscribe_all()
        await ctl.caught_up()
        try:
            tracker = await asyncio.to_thread(_open, args, ctl)
            print("%s: %s" % (NAMES[args.format], tracker.where()), flush=True)
            sent = await asyncio.to_thread(tracker.push, cursor.take())
            if args.follow:
                sent += await _follow(ctl, tracker, cursor)
            state = ctl.state.run_state()
            tracker.attach(RunReport(ctl.state).write)
            tracker.finish(state)
        except UsageError:
            raise
        except Exception as exc:  # the tracker's own errors (its server, its store, auth)
            print("rankdeck: %s: %s" % (NAMES[args.format], shown(str(exc))[:2000]),
                  file=sys.stderr)
            return EXIT_FAILED
    print("%s: %d points of run %s (%s)" % (NAMES[args.format], sent, ctl.run_id, state))
    return EXIT_UNREACHABLE if failed else EXIT_OK


def _open(args, ctl):
    masker = ctl.state.masker
    state = ctl.state.run_state()
    sent, marks = params(ctl.record, masker), tags(ctl.record, ctl.state.launcher, state, masker)
    if args.format == "mlflow":
        from ..records.to_mlflow import MlflowRun
        return MlflowRun(args.tracking_uri, args.experiment, ctl.run_id,
                         ctl.record.get("created") or ctl.state.started, sent, marks)
    from ..records.to_wandb import WandbRun
    return WandbRun(args.project, args.out, ctl.run_id, sent, marks)


async def _follow(ctl, tracker, cursor: Cursor) -> int:
    """Pushes what is new every FOLLOW_EVERY s until the run ends, then the rest; how many
    points."""
    sent = 0
    done = asyncio.ensure_future(ctl.wait_done())
    while not done.done():
        await asyncio.wait([done], timeout=FOLLOW_EVERY)
        sent += await asyncio.to_thread(tracker.push, cursor.take())
    await ctl.caught_up()  # the records the nodes journaled as they ended
    return sent + await asyncio.to_thread(tracker.push, cursor.take())
