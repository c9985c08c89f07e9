"""`launch --prometheus PORT` with real parts: a real Prometheus server (Debian's package) scrapes
the endpoint the run's judge serves (agent/judge/prometheus.py) for a detached run of the
reference trainer under real torchrun, with no console; Prometheus's HTTP API shows every
rank's step rising and the ranks stalled during an injected hang; ``promtool check metrics``
passes on the endpoint's text."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request

import pytest

from agent.host.runfiles import read_json
from tests.waits import wait_for_sync

from .test_judge import launch_detached, stop

pytestmark = pytest.mark.e2e
TIMEOUT = 180
TOOLS = ("prometheus", "promtool")
NEEDS = ("needs Debian's prometheus package (prometheus, promtool): `apt-get install "
         "prometheus` as root, or `bash scripts/setup.sh --test`")


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    """Where prometheus and promtool are; installed from Debian's package first when missing
    and this is root (as scripts/setup.sh --test does), else the test is skipped."""
    if any(shutil.which(t) is None for t in TOOLS) and os.geteuid() == 0 \
            and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                        "prometheus"], env=env, capture_output=True, timeout=600)
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip("%s; %s not found" % (NEEDS, ", ".join(missing)))
    return {t: shutil.which(t) for t in TOOLS}


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of this test's own on a loopback port: its config and data in
    ``folder``, scraping ``target`` every second; :meth:`close` ends it by its PID. Started,
    not yet ready: :meth:`wait_ready` waits for it (the test launches its run meanwhile)."""

    def __init__(self, binary: str, folder, target: str):
        self.port = free_port("127.0.0.1")
        config = folder / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: rankdeck\n    static_configs:\n"
            "      - targets: ['%s']\n" % target)
        self.log = folder / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, "--config.file=%s" % config, "--storage.tsdb.path=%s" % (folder / "data"),
                 "--web.listen-address=127.0.0.1:%d" % self.port], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self) -> None:
        wait_for_sync(self.ready, 60, lambda: "Prometheus ready; its log:\n"
                      + self.log.read_text()[-3000:], every=0.2)

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port,
                                        timeout=5) as res:
                return res.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        """``/api/v1/query``: the result's series (``metric``, ``value`` or ``values``)."""
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (
            self.port, urllib.parse.urlencode({"query": expr}))
        with urllib.request.urlopen(url, timeout=10) as res:
            body = json.loads(res.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def test_a_real_prometheus_scrapes_every_rank_rising_and_the_ranks_stalled_in_a_hang(
        tmp_path, tools):
    # the default address: the first host's (node0, 127.0.0.2), where the judge listens
    port = free_port("127.0.0.2")
    prom = Prometheus(tools["prometheus"], tmp_path, "127.0.0.2:%d" % port)
    run_id = None
    try:
        # 2 nodes x 2 ranks; a step every 0.2 s or so, then rank 1 hangs before step 25 and
        # every rank waits for it (the others in their all-reduce); --grace 3: the stop kills
        # the hung ranks (they ignore SIGTERM) after 3 s, not 10
        run_id, workdir = launch_detached(
            tmp_path, ["--steps", "100000", "--ckpt-every", "10", "--pg-timeout", "600",
                       "--idle-s", "0.2", "--hang-at-step", "25", "--hang-rank", "1"],
            "--max-restarts", "0", "--stall-after", "6", "--grace", "3",
            "--nproc-per-node", "2", "--prometheus", str(port), nodes=2)
        # ready long before the hang: the run's torch start-up and 25 steps are still ahead
        prom.wait_ready()
        judge = read_json(os.path.join(workdir, ".rankdeck", "runs", run_id, "judge",
                                       "state.json"))
        assert judge["prometheus"] == {"url": "http://127.0.0.2:%d/metrics" % port}, judge

        # every rank's step, as Prometheus stored it over the last minute, rising
        def rising() -> list[dict] | None:
            series = prom.query("rankdeck_rank_step[1m]")
            ok = len(series) == 4 and all(
                len({v for _t, v in s["values"]}) >= 2 and
                [float(v) for _t, v in s["values"]] == sorted(float(v) for _t, v in s["values"])
                for s in series)
            return series if ok else None
        series = wait_for_sync(rising, TIMEOUT, lambda: "every rank's step rising in "
                               "Prometheus: %s" % prom.query("rankdeck_rank_step"), every=1.0)
        labels = sorted((s["metric"]["rank"], s["metric"]["node"], s["metric"]["host"],
                         s["metric"]["run"]) for s in series)
        assert labels == [("0", "node0", "127.0.0.2", run_id), ("1", "node0", "127.0.0.2", run_id),
                          ("2", "node1", "127.0.0.3", run_id), ("3", "node1", "127.0.0.3", run_id)]

        # the hang: rankdeck_rank_stalled goes from 0 to 1, the hung rank's among them
        wait_for_sync(lambda: prom.query('rankdeck_rank_stalled{rank="1"} == 1'), TIMEOUT,
                      lambda: "rank 1 stalled in Prometheus: %s"
                      % prom.query("rankdeck_rank_stalled"), every=1.0)
        history = prom.query('rankdeck_rank_stalled{rank="1"}[5m]')[0]["values"]
        values = [v for _t, v in history]
        assert values[0] == "0" and values[-1] == "1", values  # running, then stalled
        up = prom.query('up{job="rankdeck"}')
        assert [s["value"][1] for s in up] == ["1"], up
        assert {s["value"][1] for s in prom.query("rankdeck_node_up")} == {"1"}
        # the checkpoints of steps 10 and 20, before the hang, as each node's supervisor
        # forwarded them to the judge (agent/supervisor/judge_link.py FORWARD)
        saved = wait_for_sync(lambda: prom.query("rankdeck_checkpoint_last_step"), TIMEOUT,
                              "the checkpoint step in Prometheus", every=1.0)
        assert {s["value"][1] for s in saved} == {"20"}, saved

        # promtool: the endpoint's text is valid and lint-clean
        with urllib.request.urlopen("http://127.0.0.2:%d/metrics" % port, timeout=10) as res:
            text = res.read()
        check = subprocess.run([tools["promtool"], "check", "metrics"], input=text,
                               capture_output=True, timeout=60)
        assert check.returncode == 0, (check.stdout + check.stderr).decode() + text.decode()
        stop(run_id)
        run_id = None
    finally:
        prom.close()
        if run_id is not None:
            stop(run_id)
