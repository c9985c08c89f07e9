"""`rankdeck export`: a run's numbers as files: per rank per step, and per node its telemetry.

Fed by RunState's record listeners while the run's journals are replayed (the same replay
`status` and `attach` do), so it holds what the nodes journaled: every ``metric`` record
(step, loss, lr, step time, tokens/s) and every ``telemetry`` record (the supervisor's sample
every 10 s; agent/host/stats.py ``TelemetryRecorder``). Two files per format in ``--out``:

- ``<run>-ranks.jsonl|csv``: ``ts, node, rank, step, loss, lr, step_time, tok_s``
- ``<run>-nodes.jsonl|csv``: ``ts, node`` and the telemetry row of console/model/telemetry.py
  (GPU utilisation min/mean, GPU memory, network and InfiniBand Gbit/s, CPU %, memory, load,
  disk MB/s, hottest GPU, power, ECC, Xids, throttling, links down)

A value the node did not give is null in JSON and empty in CSV. Host text (interface names)
is cut to safe characters, so a CSV opened in a spreadsheet holds no formula.

``tensorboard`` (the optional extra ``rankdeck[tensorboard]``) writes TensorBoard event files
through the tensorboard package, one folder per rank and per node under ``<out>/<run>/``:
``rank3/`` with the scalars loss, lr, step_time, tok_s by step; ``node0/`` with
``telemetry/<column>`` by sample (wall time is the node's clock).

``mlflow`` and ``wandb`` (the optional extras ``rankdeck[mlflow]``, ``rankdeck[wandb]``) send
the same rows, every rank figure and each GPU's too, to an experiment tracker
(console/records/tracked.py; docs/EXPORTS.md).
"""

from __future__ import annotations

import csv
import json
import os
import re

from ..errors import UsageError
from ..model.state import RunState
from ..model.telemetry import COLUMNS, gpus_of, host_number, node_telemetry

FORMATS = ("jsonl", "csv", "tensorboard", "mlflow", "wandb")
TENSORBOARD_MISSING = ("--format tensorboard needs the tensorboard package: "
                       "pip install 'rankdeck[tensorboard]'")
RANK_FIELDS = ("ts", "node", "rank", "step", "loss", "lr", "step_time", "tok_s")
# a node's row: its telemetry without the per-rank columns (they are in the ranks file)
NODE_FIELDS = ("ts", "node") + tuple(c for c in COLUMNS if c not in ("step_time", "tok_s")) + (
    "throttle", "links_down")
# a rank's figures a trainer may print (agent/formats/metrics.py); the files keep RANK_FIELDS,
# the trackers (console/records/tracked.py) every one of them
METRICS = ("loss", "lr", "step_time", "tok_s", "samples_s", "tflops")
GPU_FIGURES = ("util", "mem_used", "mem_total", "temp", "power")  # each GPU's, for the trackers
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/-]")


def _num(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return value


def _name(value) -> str:
    """A host's name for a thing (an interface), cut to characters no reader interprets."""
    return _UNSAFE.sub("", str(value))[:64]


class RunExport:
    """Collects a run's rank metrics and node telemetry from RunState as records arrive."""

    def __init__(self, state: RunState):
        self.state = state
        self.ranks: list[dict] = []
        self.nodes: list[dict] = []
        state.record_listeners.append(self._record)

    def _record(self, node: str, meta: dict) -> None:
        kind = meta.get("k")
        if kind == "metric":
            fi = self.state.nodes[node].files.get(meta.get("f"))
            if fi is None or fi.rank is None:
                return  # a line of torchrun's own output, not a rank's
            row = {"ts": _num(meta.get("ts")), "node": node, "rank": fi.rank}
            row["step"] = _num(meta.get("step"))
            row.update((key, _num(meta.get(key))) for key in METRICS)
            self.ranks.append(row)
        elif kind == "telemetry":
            full = node_telemetry(meta.get("gpu"), meta.get("host"))
            row = {"ts": _num(meta.get("ts")), "node": node}
            row.update((key, full[key]) for key in NODE_FIELDS[2:])
            row["throttle"] = [_name(r) for r in row["throttle"]]
            row["links_down"] = [_name(link) for link in row["links_down"]]
            row["gpus"] = [(gpu.get("index"), {key: host_number(gpu.get(key))
                                               for key in GPU_FIGURES})
                           for gpu in gpus_of(meta.get("gpu"))]
            self.nodes.append(row)

    def write(self, out_dir: str, fmt: str) -> list[str]:
        """Writes both files into ``out_dir`` (made if missing); returns their paths. For
        ``tensorboard``: the event files; UsageError when the package is not installed."""
        if fmt == "tensorboard":
            return self._write_tensorboard(os.path.join(out_dir, _name(self.state.run_id)))
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for what, fields, rows in (("ranks", RANK_FIELDS, self.ranks),
                                   ("nodes", NODE_FIELDS, self.nodes)):
            path = os.path.join(out_dir, "%s-%s.%s" % (self.state.run_id, what, fmt))
            with open(path, "w", newline="", encoding="utf-8") as f:
                (_write_jsonl if fmt == "jsonl" else _write_csv)(f, fields, rows)
            paths.append(path)
        return paths


    def _write_tensorboard(self, run_dir: str) -> list[str]:
        Event, Summary, EventFileWriter = tensorboard_writer()
        series: dict[str, list[tuple[float, int, dict]]] = {}
        for row in self.ranks:
            if row["step"] is not None:
                scalars = {key: row[key] for key in RANK_FIELDS[4:]}
                series.setdefault("rank%d" % row["rank"], []).append((row["ts"], row["step"],
                                                                      scalars))
        for row in self.nodes:
            rows = series.setdefault(_name(row["node"]), [])
            scalars = {"telemetry/" + key: row[key] for key in NODE_FIELDS[2:]}
            rows.append((row["ts"], len(rows), scalars))
        paths = []
        for name, rows in series.items():
            writer = EventFileWriter(os.path.join(run_dir, name))
            for ts, step, scalars in rows:
                values = [Summary.Value(tag=tag, simple_value=value)
                          for tag, value in scalars.items() if _num(value) is not None]
                writer.add_event(Event(wall_time=ts or 0.0, step=step,
                                       summary=Summary(value=values)))
            writer.close()
            folder = os.path.join(run_dir, name)
            paths += [os.path.join(folder, f) for f in sorted(os.listdir(folder))]
        return paths


def check_format(fmt: str) -> None:
    """UsageError (exit 2, nothing started) when ``fmt`` needs a package that is missing."""
    if fmt == "tensorboard":
        tensorboard_writer()
    elif fmt == "mlflow":
        from .to_mlflow import mlflow_client
        mlflow_client()
    elif fmt == "wandb":
        from .to_wandb import wandb_module
        wandb_module()


def tensorboard_writer():
    """tensorboard's (Event, Summary, EventFileWriter); UsageError saying how to install it."""
    try:  # the optional extra; importing it takes seconds, so only for this format
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        raise UsageError(TENSORBOARD_MISSING) from exc
    return Event, Summary, EventFileWriter


def _write_jsonl(f, fields, rows) -> None:
    for row in rows:
        f.write(json.dumps({key: row.get(key) for key in fields}, separators=(",", ":")) + "\n")


def _write_csv(f, fields, rows) -> None:
    writer = csv.writer(f)
    writer.writerow(fields)
    for row in rows:
        writer.writerow(["" if row.get(key) is None else ";".join(row[key])
                         if isinstance(row.get(key), list) else row[key] for key in fields])
