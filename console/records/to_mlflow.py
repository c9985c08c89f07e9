"""`rankdeck export RUN --format mlflow`: the run as one MLflow run (docs/EXPORTS.md).

Through MLflow's own client (``mlflow-skinny``, the optional extra ``rankdeck[mlflow]``), so
every tracking URI MLflow takes works: an ``http(s)://`` tracking server (its auth from
MLflow's own variables, ``MLFLOW_TRACKING_TOKEN`` or ``MLFLOW_TRACKING_USERNAME``/
``_PASSWORD``), ``databricks``, a local ``sqlite:///mlflow.db`` (MLflow's default: needs the
full ``mlflow`` package) or a ``file:`` store. What is sent: console/records/tracked.py.

Within MLflow's limits on one ``log-batch`` call: 1000 metrics, 100 params, 100 tags; a param
value of 6000 characters. The MLflow run is named for the rankdeck run and tagged
``rankdeck.run_id``; an experiment that has one for the run already is refused (exit 2): a
second export would log every point twice.
"""

from __future__ import annotations

import os
import tempfile

from ..errors import UsageError
from .tracked import END_STATUS, Series

MISSING = ("--format mlflow needs the MLflow client: pip install 'rankdeck[mlflow]' "
           "(or the full mlflow package)")
METRICS_PER_CALL, PARAMS_PER_CALL, TAGS_PER_CALL = 1000, 100, 100


def mlflow_client():
    """MLflow's (MlflowClient, Metric, Param, RunTag); UsageError saying how to install it."""
    try:  # the optional extra; importing it takes seconds, so only for this format
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise UsageError(MISSING) from exc
    return MlflowClient, Metric, Param, RunTag


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class MlflowRun:
    """One MLflow run for a rankdeck run, made in experiment ``experiment`` (made if missing)
    of ``tracking_uri`` (None: MLflow's own default, ``MLFLOW_TRACKING_URI``)."""

    def __init__(self, tracking_uri: str | None, experiment: str, run_id: str,
                 started: float, params: dict, tags: dict):
        MlflowClient, self.Metric, Param, RunTag = mlflow_client()
        if tracking_uri and (tracking_uri.startswith("file:") or "://" not in tracking_uri):
            # a folder the user named: MLflow 3 refuses its file store unless asked for it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = self.client.tracking_uri
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (found.experiment_id if found is not None
                              else self.client.create_experiment(experiment))
        old = self.client.search_runs([self.experiment_id], max_results=1,
                                      filter_string="tags.`rankdeck.run_id` = '%s'" % run_id)
        if old:
            raise UsageError("MLflow experiment %r already holds run %s (MLflow run %s): "
                             "delete that MLflow run, or export into another --experiment"
                             % (experiment, run_id, old[0].info.run_id))
        run = self.client.create_run(self.experiment_id, start_time=int(started * 1000),
                                     run_name=run_id, tags={"rankdeck.run_id": run_id})
        self.id = run.info.run_id
        for chunk in _chunks([Param(k, v) for k, v in params.items()], PARAMS_PER_CALL):
            self.client.log_batch(self.id, params=chunk, synchronous=True)
        self.set_tags(tags)

    def set_tags(self, tags: dict) -> None:
        _MlflowClient, _Metric, _Param, RunTag = mlflow_client()
        for chunk in _chunks([RunTag(k, v) for k, v in tags.items()], TAGS_PER_CALL):
            self.client.log_batch(self.id, tags=chunk, synchronous=True)

    def push(self, rows: list[Series]) -> int:
        """Logs ``rows``' points; how many."""
        points = [self.Metric("%s/%s" % (row.prefix, name), float(value),
                              int(row.ts * 1000), row.x)
                  for row in rows for name, value in row.figures.items()]
        for chunk in _chunks(points, METRICS_PER_CALL):
            self.client.log_batch(self.id, metrics=chunk, synchronous=True)
        return len(points)

    def attach(self, write) -> None:
        """The files ``write(folder)`` makes (the run's report) as the run's ``report/``."""
        with tempfile.TemporaryDirectory(prefix="rankdeck-report-") as folder:
            for path in write(folder):
                self.client.log_artifact(self.id, path, artifact_path="report")

    def finish(self, state: str) -> None:
        """Ends the MLflow run with the rankdeck run's end (FINISHED, FAILED, KILLED)."""
        self.set_tags({"rankdeck.state": state})
        self.client.set_terminated(self.id, status=END_STATUS.get(state, "FINISHED"))

    def where(self) -> str:
        """Where to see it: the run's page on a tracking server, else the store and run id."""
        base = self.tracking_uri
        if base.startswith(("http://", "https://")):
            return "%s/#/experiments/%s/runs/%s" % (base.rstrip("/"), self.experiment_id,
                                                   self.id)
        return "MLflow run %s in %s" % (self.id, base)
