"""What `rankdeck export --format mlflow|wandb` sends to an experiment tracker (docs/EXPORTS.md).

The figures are :class:`console.records.export.RunExport`'s rows (the one reader of a run's
``metric`` and ``telemetry`` records, which the JSON lines, CSV and TensorBoard exports write
too), cut into :class:`Series` points here:

- each rank's figures by its step: ``rank3/loss``, ``rank3/tok_s`` (every figure the trainer
  printed: loss, lr, step_time, tok_s, samples_s, tflops); a record with no step is left out;
- each node's telemetry by time (seconds since the run started, and the node's clock as the
  point's time): ``node0/cpu_pct``, ``node0/net_rx_gbps``, ``node0/gpu_util_mean`` and each
  GPU's own ``node0/gpu0_util``, ``node0/gpu0_mem_used``.

:class:`Cursor` hands out only the rows that came since its last call (``--follow`` sends what
is new). :func:`params` and :func:`tags` are the run's launch options and names from its
record, which keeps no secret value (console/launch/env.py); each value is masked with the
run's secrets all the same and cleaned of control characters. ``--notify``'s command is not
sent (a webhook's address may hold a token): only that there is one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..lines.sanitize import Masker, clean
from .export import GPU_FIGURES, METRICS, NODE_FIELDS

# a node's figures that are numbers (throttle and links_down are lists of names)
NODE_FIGURES = tuple(c for c in NODE_FIELDS[2:] if c not in ("throttle", "links_down"))
VALUE_MAX = 6000  # MLflow's longest param value; W&B's config takes it too
RANK_AXIS, NODE_AXIS = "step", "time_s"
# a run's end state as MLflow names it (a run still running when exported: FINISHED)
END_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
_KEY = re.compile(r"[^A-Za-z0-9_.-]")


def key_name(text) -> str:
    """A name from a host or an inventory as part of a metric's name: characters both
    trackers take, at most 64."""
    return _KEY.sub("_", str(text))[:64] or "_"


@dataclass
class Series:
    """One row of points: ``prefix`` (``rank3``, ``node0``), the x-axis value ``x`` (the
    rank's step; the node's seconds since the run started), ``ts`` (seconds, the host's
    clock) and ``figures`` ``{name: number}``."""

    prefix: str
    axis: str
    x: int
    ts: float
    figures: dict


class Cursor:
    """The rows of a RunExport not handed out yet, as Series: ``started`` is the run's start
    (its record's ``created``), the nodes' time axis counts from it."""

    def __init__(self, export, started: float):
        self.export = export
        self.started = started
        self.ranks_at = 0
        self.nodes_at = 0

    def take(self) -> list[Series]:
        """The Series of the rows that came since the last call."""
        ranks = self.export.ranks[self.ranks_at:]
        nodes = self.export.nodes[self.nodes_at:]
        self.ranks_at += len(ranks)
        self.nodes_at += len(nodes)
        out = []
        for row in ranks:
            figures = {key: row[key] for key in METRICS if row.get(key) is not None}
            if _whole(row.get("step")) and figures:
                out.append(Series("rank%d" % row["rank"], RANK_AXIS, int(row["step"]),
                                  row["ts"] if _time(row.get("ts")) else self.started, figures))
        for row in nodes:
            if not _time(row.get("ts")):
                continue
            figures = {key: row[key] for key in NODE_FIGURES if row.get(key) is not None}
            for index, gpu in row.get("gpus") or ():
                figures.update(("gpu%s_%s" % (key_name(index), key), gpu[key])
                               for key in GPU_FIGURES if gpu.get(key) is not None)
            if figures:
                out.append(Series(key_name(row["node"]), NODE_AXIS,
                                  max(0, int(row["ts"] - self.started)), row["ts"], figures))
        return out


def _whole(step) -> bool:
    """A step both trackers keep (a 64-bit integer): a host's number is checked first."""
    return isinstance(step, (int, float)) and float(step).is_integer() and abs(step) < 2 ** 62


def _time(ts) -> bool:
    return isinstance(ts, (int, float)) and 0 <= ts < 1e11  # seconds, before the year 5138


def _text(value, masker: Masker) -> str:
    if not isinstance(value, str):
        value = json.dumps(value, sort_keys=True)
    return clean(value, masker, VALUE_MAX)[:VALUE_MAX]


def params(record: dict, masker: Masker) -> dict[str, str]:
    """The run's launch options and names, ``{name: text}``: the spec's options as the run
    record keeps them (``--env`` and inventory values as their names only), the nodes, the
    inventory file, the transport. Empty options are left out."""
    spec = dict(record.get("spec") or {})
    if spec.get("notify"):
        spec["notify"] = "set (the command is not exported)"
    spec["env"] = sorted(spec.get("env") or {})  # names: the record keeps no value
    hosts = [h for h in record.get("hosts") or () if isinstance(h, dict)]
    spec.update({"nodes": [h.get("name") for h in hosts],
                 "host_env": sorted({k for h in hosts for k in (h.get("env") or {})}),
                 "secret_env": record.get("secret_env") or [],
                 "inventory": record.get("inventory"), "transport": record.get("transport",
                                                                                "ssh")})
    return {key_name(k): _text(v, masker) for k, v in sorted(spec.items())
            if v not in (None, "", [], {})}


def tags(record: dict, launcher: str, state: str, masker: Masker) -> dict[str, str]:
    """``rankdeck.run_id``, ``rankdeck.launcher``, ``rankdeck.transport`` and the run's
    ``rankdeck.state`` when exported."""
    return {"rankdeck.run_id": _text(record.get("run_id", ""), masker),
            "rankdeck.launcher": _text(launcher, masker),
            "rankdeck.transport": _text(record.get("transport", "ssh"), masker),
            "rankdeck.state": _text(state, masker)}
