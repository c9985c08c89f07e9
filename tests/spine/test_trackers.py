"""`rankdeck export --format mlflow|wandb` with real parts: one short run of the reference trainer
(real torchrun, CPU, 2 local nodes, a secret in the inventory's env) shared by the tests; a real
``mlflow server`` (sqlite store, its artifacts on disk) on a loopback port, ended by its PID.

- ``--follow`` started with the run: the MLflow run gains points while it is RUNNING, and ends
  FINISHED with the run;
- a second export once the run ended: every rank's figures by step, read back through MLflow's
  REST API (``/api/2.0/mlflow/metrics/get-history``), equal the run's own (``export --format
  jsonl``), every node's telemetry is there, the report is an artifact, and the secret's value
  is nowhere in the server's store or artifacts;
- W&B offline (``WANDB_MODE=offline``, no network): the run's ``.wandb`` file read back with
  the wandb library's own record format holds every rank's loss by step and every node's
  telemetry.

Waits overlap where nothing orders them: the MLflow server starts while the run is launched,
and once the run's processes are gone the reads of its end that the tests make (`status`,
``export --format jsonl``, the first MLflow export, the W&B export) run side by side, each a
console's start-up, while ``--follow`` says its last; each test reads its own.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.cli import UNBUFFERED, rankdeck, start_rankdeck
from tests.local_nodes import write_inventory
from tests.waits import wait_for_sync

from .helpers import TINY, TRAINER, all_ended, processes_of

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytestmark = pytest.mark.e2e
TIMEOUT = 300
STEPS = 80  # a step every 0.2 s or so: the run lives for --follow and a few telemetry samples
MLFLOW = [sys.executable, "-m", "mlflow"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` of this module's own: sqlite store and artifacts in ``folder``."""

    def __init__(self, folder):
        self.folder = folder
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = folder / "mlflow.log"
        # no job runner: MLflow 3's server starts one beside it (a huey consumer a queue, each
        # a Python that imports mlflow: 8 of them) for its GenAI jobs, which no export asks for
        env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        with open(self.log, "wb") as log:  # started here; ready() after the run's launch
            self.proc = subprocess.Popen(
                MLFLOW + ["server", "--host", "127.0.0.1", "--port", str(self.port),
                          "--workers", "1", "--backend-store-uri",
                          "sqlite:///%s" % (folder / "mlflow.db"),
                          "--artifacts-destination", str(folder / "artifacts")],
                cwd=str(folder), env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self) -> None:
        wait_for_sync(self.ready, 180, lambda: "mlflow server up; its log:\n"
                      + self.log.read_text()[-3000:], every=0.5)

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as res:
                return res.status == 200
        except OSError:
            return False

    def get(self, endpoint: str, **query) -> dict:
        url = "%s/api/2.0/mlflow/%s?%s" % (self.url, endpoint, urllib.parse.urlencode(query))
        with urllib.request.urlopen(url, timeout=30) as res:
            return json.loads(res.read())

    def run_of(self, experiment: str) -> dict | None:
        """The one MLflow run in ``experiment`` (None before there is one)."""
        try:
            exp = self.get("experiments/get-by-name", experiment_name=experiment)
        except urllib.error.HTTPError:
            return None
        body = json.dumps({"experiment_ids": [exp["experiment"]["experiment_id"]]}).encode()
        req = urllib.request.Request(self.url + "/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as res:
            runs = json.loads(res.read()).get("runs", [])
        assert len(runs) <= 1, runs
        return runs[0] if runs else None

    def history(self, run_uuid: str, key: str) -> list[tuple[int, float]]:
        got = self.get("metrics/get-history", run_id=run_uuid, metric_key=key,
                       max_results=25000).get("metrics", [])
        return sorted((int(m.get("step", 0)), m["value"]) for m in got)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # uvicorn's worker goes with it
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


class Run:
    """The module's run: its id, the secret in its inventory, the environment every
    ``rankdeck`` of the module gets (one state folder: the run's record is in it)."""

    def __init__(self, folder):
        self.folder = folder
        self.secret = "trk-" + secrets.token_hex(16)
        self.env = dict(UNBUFFERED, XDG_STATE_HOME=str(folder / "state"),
                        XDG_CACHE_HOME=str(folder / "cache"),
                        RANKDECK_TEST_TRACKER_TOKEN=self.secret,
                        WANDB_MODE="offline", WANDB_CONFIG_DIR=str(folder / "wandb-config"),
                        WANDB_CACHE_DIR=str(folder / "wandb-cache"),
                        WANDB_DATA_DIR=str(folder / "wandb-data"), WANDB_SILENT="true")
        inv = write_inventory(folder, folder / "work", 2,
                              "  env:\n    TOKEN: ${RANKDECK_TEST_TRACKER_TOKEN}\n")
        out = rankdeck("launch", "--detach", "--skip-preflight", "-i", inv, "--max-restarts",
                       "0", TRAINER, "--", *TINY, "--steps", str(STEPS), "--ckpt-every", "0",
                       "--idle-s", "0.2", env=self.env)
        assert out.returncode == 0, out.stdout + out.stderr
        self.run_id = out.stdout.strip().splitlines()[-1]
        self.ranks: list[dict] | None = None
        self.ended = False
        self.closing = False
        self._pool = ThreadPoolExecutor(6)  # the watch for the run's end and its 5 reads
        self.after_end: Future | None = None

    def watch_end(self, server: MlflowServer) -> None:
        """Reads the run's end as soon as it comes (:meth:`_after_end`)."""
        self.after_end = self._pool.submit(self._after_end, server)

    def _after_end(self, server: MlflowServer) -> dict[str, Future]:
        """Once every process of the run is gone: `status`, the jsonl export, the MLflow
        export (experiment ``once``; the same again when it is done) and the W&B export, side
        by side."""
        all_ended(self.run_id, TIMEOUT)
        if self.closing:  # the module's tests are over: the run was killed
            return {}
        jobs = {"status": ("status", self.run_id, "--json"),
                "jsonl": ("export", self.run_id, "--format", "jsonl",
                          "--out", str(self.folder / "jsonl")),
                "wandb": ("export", self.run_id, "--format", "wandb",
                          "--out", str(self.folder / "wb"))}
        done = {name: self._pool.submit(self.rankdeck, *args) for name, args in jobs.items()}
        once = ("export", self.run_id, "--format", "mlflow", "--tracking-uri", server.url,
                "--experiment", "once")
        done["mlflow"] = self._pool.submit(self.rankdeck, *once)
        # the same export again, once the first is done: what MLflow's test asserts refused
        done["mlflow again"] = self._pool.submit(
            lambda: done["mlflow"].result() and self.rankdeck(*once))
        return done

    def after(self, name: str) -> subprocess.CompletedProcess:
        """What ``name`` of :meth:`_after_end` printed, once it is done."""
        return self.after_end.result(TIMEOUT)[name].result(TIMEOUT)

    def rankdeck(self, *args: str, **env) -> subprocess.CompletedProcess:
        return rankdeck(*args, timeout=TIMEOUT, env=dict(self.env, **env))

    def wait_ended(self) -> None:
        """Every process of the run gone, then its end as `status` says it (asked once: an
        ended run's end does not change, and each `status` is a console's start-up)."""
        if self.ended:
            return
        all_ended(self.run_id, TIMEOUT)
        out = self.after("status")
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout)["state"] == "succeeded", out.stdout
        self.ended = True

    def close(self) -> None:
        """The reads of the run's end finished (the run's processes killed first)."""
        self.closing = True
        self._pool.shutdown(wait=True)

    def kill_what_is_left(self) -> None:
        for pid, _cmd in processes_of(self.run_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def rows(self) -> list[dict]:
        """The ended run's rank rows as `export --format jsonl` writes them (once)."""
        if self.ranks is None:
            out = self.after("jsonl")
            assert out.returncode == 0, out.stdout + out.stderr
            with open(str(self.folder / "jsonl" / ("%s-ranks.jsonl" % self.run_id))) as f:
                self.ranks = [json.loads(line) for line in f]
        return self.ranks


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The MLflow server, started (the ``run`` fixture waits until it is up)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory, server):
    run = Run(tmp_path_factory.mktemp("trackers"))
    try:
        server.wait_ready()  # it started while the run was launched
        run.watch_end(server)
        yield run
    finally:
        run.closing = True
        run.kill_what_is_left()  # a test that failed may leave it running
        run.close()


def by_step(rows: list[dict], rank: int, key: str) -> list[tuple[int, float]]:
    return sorted((r["step"], r[key]) for r in rows
                  if r["rank"] == rank and r["step"] is not None and r[key] is not None)


def test_follow_adds_points_while_the_run_lives_and_ends_with_it(run, server):
    proc = start_rankdeck("export", run.run_id, "--format", "mlflow", "--follow",
                          "--tracking-uri", server.url, "--experiment", "follow",
                          env=run.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def counted(least: int):
            found = server.run_of("follow")
            if found is None or found["info"]["status"] != "RUNNING":
                assert found is None or proc.poll() is None, "the run ended first"
                return None
            n = len(server.history(found["info"]["run_id"], "rank0/loss"))
            return n if n > least else None
        first = wait_for_sync(lambda: counted(0), TIMEOUT, "rank 0's loss in MLflow", every=1.0)
        later = wait_for_sync(lambda: counted(first), TIMEOUT, "more of rank 0's loss while "
                              "the MLflow run is RUNNING", every=1.0)
        assert later > first
        out, err = proc.communicate(timeout=TIMEOUT)

    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert "(succeeded)" in out, out
    done = server.run_of("follow")
    assert done["info"]["status"] == "FINISHED", done["info"]
    rows = run.rows()
    for rank in (0, 1):  # nothing lost, nothing twice
        assert server.history(done["info"]["run_id"], "rank%d/loss" % rank) == \
            by_step(rows, rank, "loss")


def test_mlflow_holds_every_ranks_steps_every_nodes_telemetry_and_no_secret(
        run, server):
    run.wait_ended()
    out = run.after("mlflow")  # started as the run ended (Run._after_end)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "%s/#/experiments/" % server.url in out.stdout, out.stdout
    found = server.run_of("once")
    info, data = found["info"], found["data"]
    assert info["status"] == "FINISHED" and info["run_name"] == run.run_id
    rows = run.rows()
    assert {r["rank"] for r in rows} == {0, 1}
    for rank in (0, 1):
        for key in ("loss", "lr", "step_time", "tok_s"):
            want = by_step(rows, rank, key)
            assert len(want) == STEPS, (rank, key, want)
            assert server.history(info["run_id"], "rank%d/%s" % (rank, key)) == want
    metrics = {m["key"] for m in data["metrics"]}
    for node in ("node0", "node1"):
        assert {node + "/cpu_pct", node + "/mem_used", node + "/load1"} <= metrics, metrics
        assert len(server.history(info["run_id"], node + "/mem_used")) >= 1
    params = {p["key"]: p["value"] for p in data["params"]}
    assert params["nodes"] == '["node0", "node1"]' and params["host_env"] == '["TOKEN"]'
    assert params["script"] == TRAINER and "--idle-s" in params["args"]
    tags = {t["key"]: t["value"] for t in data["tags"]}
    assert (tags["rankdeck.run_id"], tags["rankdeck.launcher"], tags["rankdeck.state"]) == (
        run.run_id, "torchrun", "succeeded")
    artifacts = server.get("artifacts/list", run_id=info["run_id"], path="report")["files"]
    assert sorted(os.path.basename(a["path"]) for a in artifacts) == [
        "%s-loss.svg" % run.run_id, "%s-report.md" % run.run_id]
    # the secret was in the run's environment and this shell's: nowhere in what MLflow keeps
    kept = [os.path.join(d, f) for d, _s, fs in os.walk(str(server.folder)) for f in fs]
    assert any(p.endswith("report.md") for p in kept) and len(kept) > 2
    for path in kept:
        with open(path, "rb") as f:
            assert run.secret.encode() not in f.read(), path
    # a second export into the same experiment would log every point twice: refused
    again = run.after("mlflow again")  # started once the first was done (Run._after_end)
    assert again.returncode == 2 and "already holds run %s" % run.run_id in again.stderr


def wandb_records(path: str) -> list:
    """The records of a ``.wandb`` file, W&B's own: LevelDB's log format (32 KiB blocks of
    chunks with a 7-byte header) after its ``:W&B`` header, each a wandb Record protobuf."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:8]
    pos, block, records, parts = 7, 32768, [], b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # a block's tail too short for a header: padding
            pos += room
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(parts)
            records.append(rec)
            parts = b""
        elif kind == 0:
            break
    return records


def test_wandb_offline_run_reads_back_with_every_ranks_loss_and_every_nodes_telemetry(
        run):
    run.wait_ended()
    out = run.after("wandb")  # started as the run ended (Run._after_end)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "wandb sync" in out.stdout, out.stdout
    folder = [os.path.join(d, f) for d, _s, fs in os.walk(str(run.folder / "wb")) for f in fs]
    (path,) = [p for p in folder if p.endswith(".wandb")]
    rows = []
    for rec in wandb_records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                         for i in rec.history.item})
    want = run.rows()
    for rank in (0, 1):
        got = sorted((r["rank%d/step" % rank], r["rank%d/loss" % rank]) for r in rows
                     if "rank%d/loss" % rank in r)
        assert got == by_step(want, rank, "loss") and len(got) == STEPS
    for node in ("node0", "node1"):
        samples = [r for r in rows if node + "/cpu_pct" in r]
        assert samples and all(r[node + "/mem_used"] > 0 and node + "/time_s" in r
                               for r in samples), rows[-3:]
    assert any(p.endswith("%s-report.md" % run.run_id) for p in folder), folder
    for p in folder:  # nothing of the secret in what `wandb sync` would send
        with open(p, "rb") as f:
            assert run.secret.encode() not in f.read(), p
