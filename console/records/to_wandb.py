"""`rankdeck export RUN --format wandb`: the run as one Weights & Biases run (docs/EXPORTS.md).

Through the ``wandb`` library (the optional extra ``rankdeck[wandb]``). Every node's figures
are the run's metrics, not the machine this export runs on: W&B's own system sampling of this
laptop is off (wandb#7324 asks for every node's GPUs). Each rank's figures have the rank's step
as their x-axis (``rank3/step``), each node's the seconds since the run started
(``node0/time_s``), through ``define_metric``; what is sent: console/records/tracked.py.

``WANDB_MODE=offline`` needs no network: the run's folder under ``--out`` (``wandb/offline-run-
.../``) is what ``wandb sync`` sends later. Online, W&B's own login (``WANDB_API_KEY``,
``wandb login``) and ``WANDB_ENTITY`` apply. The report's files go into the run's files.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from .tracked import Series

MISSING = "--format wandb needs the wandb package: pip install 'rankdeck[wandb]'"


def wandb_module():
    """The wandb module; UsageError saying how to install it."""
    try:  # the optional extra; importing it takes seconds, so only for this format
        import wandb
    except ImportError as exc:
        raise UsageError(MISSING) from exc
    return wandb


class WandbRun:
    """One W&B run for a rankdeck run in ``project``; its local folder under ``out_dir``."""

    def __init__(self, project: str, out_dir: str, run_id: str, params: dict, tags: dict):
        wandb = wandb_module()
        os.makedirs(out_dir, exist_ok=True)
        # nothing of this laptop: no console capture, system sampling, metadata, code or git
        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True,
                                  x_disable_machine_info=True, save_code=False,
                                  disable_git=True, disable_job_creation=True, silent=True)
        self.run = wandb.init(project=project, name=run_id, dir=out_dir,
                              config=dict(params, **tags), tags=["rankdeck"],
                              settings=settings, reinit="create_new")
        self.axes: set[str] = set()

    def push(self, rows: list[Series]) -> int:
        """Logs ``rows`` (one ``log`` call each, with its own x-axis); how many points."""
        count = 0
        for row in rows:
            axis = "%s/%s" % (row.prefix, row.axis)
            if row.prefix not in self.axes:
                self.run.define_metric(axis)
                self.run.define_metric("%s/*" % row.prefix, step_metric=axis)
                self.axes.add(row.prefix)
            data = {"%s/%s" % (row.prefix, name): value for name, value in row.figures.items()}
            data[axis] = row.x
            self.run.log(data)
            count += len(row.figures)
        return count

    def attach(self, write) -> None:
        """The files ``write(folder)`` makes (the run's report), in the run's files folder,
        whose files W&B uploads with the run."""
        write(self.run.dir)

    def finish(self, state: str) -> None:
        """Ends the W&B run: exit code 0 for a run that succeeded (or still runs), else 1."""
        self.run.summary["rankdeck.state"] = state
        self.run.finish(exit_code=0 if state in ("succeeded", "running") else 1)

    def where(self) -> str:
        """The run's page online; offline, its folder and the command that sends it later."""
        if self.run.settings.mode == "offline" or not self.run.url:
            return "%s (offline: `wandb sync %s` sends it)" % (
                os.path.dirname(self.run.dir), os.path.dirname(self.run.dir))
        return self.run.url
