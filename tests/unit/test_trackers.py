"""`rankdeck export --format mlflow|wandb`, the parts with no run: the points a replayed journal
becomes (every figure a rank printed, each GPU's own), handed out once each (``--follow``);
the run's params from its record, masked; MLflow's log-batch limits, through MLflow's own
client on a file store; a missing package is exit 2 naming the pip command, nothing done."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from console.lines.sanitize import Masker
from console.model.state import RunState
from console.records.export import RunExport
from console.records.tracked import Cursor, params

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU = {"gpus": [{"index": 0, "util": 97, "mem_used": 70e9, "mem_total": 80e9, "temp": 71,
                 "power": 650.0}, {"index": 1, "util": 12, "mem_used": 1e9}]}
HOST = {"cpu_pct": 42.0, "mem_used": 5e9, "mem_total": 64e9, "net_rx_gbps": 1.5}


def exported(started=1000.0):
    state = RunState("run9", [("node0", "10.0.0.1")])
    export = RunExport(state)
    state.apply_records("node0", [[{"k": "file", "f": 1, "rank": 3, "local_rank": 1,
                                    "stream": "stdout", "attempt": 0, "instance": "i",
                                    "path": "x/stdout.log", "j": 0}]], 10)
    return state, export, Cursor(export, started)


def metric(step, ts, **figures):
    return [{"k": "metric", "f": 1, "step": step, "ts": ts, "j": 0, **figures}]


def test_every_figure_of_every_rank_and_each_gpu_once_each():
    state, _export, cursor = exported()
    state.apply_records("node0", [metric(1, 1001.0, loss=4.0, tok_s=900.0, tflops=12.5),
                                  metric(None, 1002.0, loss=3.0),  # no step: left out
                                  [{"k": "telemetry", "ts": 1030.5, "gpu": GPU, "host": HOST,
                                    "j": 0}]], 20)
    rank, node = cursor.take()
    assert (rank.prefix, rank.axis, rank.x, rank.ts) == ("rank3", "step", 1, 1001.0)
    assert rank.figures == {"loss": 4.0, "tok_s": 900.0, "tflops": 12.5}
    assert (node.prefix, node.axis, node.x) == ("node0", "time_s", 30)
    assert node.figures["gpu0_util"] == 97 and node.figures["gpu1_mem_used"] == 1e9
    assert node.figures["gpu0_power"] == 650.0 and "gpu1_power" not in node.figures
    assert node.figures["cpu_pct"] == 42.0 and node.figures["gpu_util_mean"] == 54.5
    assert cursor.take() == []  # --follow sends what is new only
    state.apply_records("node0", [metric(2, 1003.0, loss=2.0)], 30)
    assert [(s.prefix, s.x, s.figures) for s in cursor.take()] == [("rank3", 2, {"loss": 2.0})]


def test_params_are_the_records_options_and_names_masked():
    record = {"run_id": "run9", "transport": "local", "inventory": "/inv/hosts.yaml",
              "spec": {"script": "train.py", "args": ["--token", "s3cr3t-value-1"],
                       "env": {"WANDB_KEY": "****"}, "notify": "curl https://hook/T0KEN",
                       "nproc_per_node": 8, "checkpoint_dir": None},
              "hosts": [{"name": "a", "env": {"HF_TOKEN": "****", "MODE": "x"}},
                        {"name": "b", "env": {}}], "secret_env": ["HF_TOKEN"]}
    got = params(record, Masker(["s3cr3t-value-1"]))
    assert got["args"] == '["--token", "****"]'
    assert got["notify"] == "set (the command is not exported)"
    assert got["env"] == '["WANDB_KEY"]' and got["host_env"] == '["HF_TOKEN", "MODE"]'
    assert (got["nodes"], got["nproc_per_node"], got["transport"]) == ('["a", "b"]', "8", "local")
    assert "checkpoint_dir" not in got and "T0KEN" not in str(got)


def test_mlflow_batches_stay_within_log_batch_limits(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from console.records.to_mlflow import MlflowRun
    from console.records.tracked import Series

    calls = []
    from mlflow.tracking import MlflowClient
    real = MlflowClient.log_batch

    def log_batch(self, run_id, metrics=(), params=(), tags=(), **kw):
        calls.append((len(metrics), len(params), len(tags)))
        return real(self, run_id, metrics, params, tags, **kw)
    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)
    many = {"p%03d" % i: "v" * 6000 for i in range(150)}
    run = MlflowRun("file:%s" % (tmp_path / "mlruns"), "exp", "run9", 1000.0, many,
                    {"rankdeck.run_id": "run9"})
    rows = [Series("rank%d" % r, "step", s, 1000.0 + s, {"loss": 1.0 / (s + 1), "lr": 0.1})
            for r in range(2) for s in range(600)]
    assert run.push(rows) == 2400
    assert max(m for m, _p, _t in calls) == 1000 and max(p for _m, p, _t in calls) == 100
    assert sum(m for m, _p, _t in calls) == 2400 and sum(p for _m, p, _t in calls) == 150
    history = run.client.get_metric_history(run.id, "rank1/loss")
    assert [m.step for m in history] == list(range(600))


@pytest.mark.parametrize("fmt,package", [("mlflow", "mlflow"), ("wandb", "wandb")])
def test_a_missing_package_is_exit_2_naming_the_pip_command(tmp_path, fmt, package):
    blocked = tmp_path / "blocked" / package
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('no %s here')\n" % package)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "blocked"), REPO]))
    out = subprocess.run([sys.executable, "-m", "console", "export", "no-such-run",
                          "--format", fmt, "--out", str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pip install 'rankdeck[%s]'" % fmt in out.stderr
    assert "no-such-run" not in out.stderr  # refused before the run was looked up
    assert not (tmp_path / "out").exists()


def test_a_hosts_odd_step_or_time_is_left_out_not_an_error():
    class Rows:  # rows past what the protocol's checks let through (console/run/messages.py)
        ranks = [{"rank": 3, "step": step, "ts": ts, "loss": 1.0}
                 for step, ts in ((1e300, 1001.0), (2.5, 1001.0), (7, 1e300))]
        nodes = [{"node": "node0", "ts": float("inf"), "cpu_pct": 3.0}]
    (only,) = Cursor(Rows(), 1000.0).take()  # the step 7, at the run's start: no time given
    assert (only.prefix, only.x, only.ts) == ("rank3", 7, 1000.0)
