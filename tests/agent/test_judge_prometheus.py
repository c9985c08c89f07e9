"""The run's judge serves Prometheus's text format (``launch --prometheus``, agent/judge/prometheus.py):
a real judge process, peers speaking for nodes as agent/supervisor/judge_link.py does
(tests/agent/test_judge.py's FakeNode), and the endpoint read over real HTTP and parsed with
``prometheus-client``'s parser. With a real Prometheus and a real run: tests/spine/test_prometheus.py."""

from __future__ import annotations

import http.client
import io
import math
import os
import socket
import stat
import time

import pytest

from agent.judge.control import running_judge, start_judge, stop_judge
from agent.judge.prometheus import MAX_SCRAPES
from agent.serve.server import Server
from console.records.goodput import from_judge
from tests.agent.test_judge import TOKEN, FakeNode, events
from tests.waits import wait_for_sync

parser = pytest.importorskip("prometheus_client.parser",
                             reason="needs prometheus-client (the test extras)")
SECRET = "hunter2-very-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, method: str = "GET", path: str = "/metrics") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        res = conn.getresponse()
        return res.status, dict(res.getheaders()), res.read()
    finally:
        conn.close()


def samples(port: int) -> dict:
    """{(name, labels as sorted tuples): value} of the endpoint's families now."""
    status, headers, body = get(port)
    assert status == 200, body
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    out = {}
    for fam in parser.text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def metered(tmp_path):
    run_root = str(tmp_path / "runs" / "run-1")
    os.makedirs(run_root)
    port = free_port()
    spec = {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0", "node1"],
            "stall_after": 2.0, "secrets": [SECRET],
            "prometheus": {"addr": "127.0.0.1", "port": port,
                           "hosts": {"node0": "10.0.0.1", "node1": SECRET + ".example"}}}
    info = start_judge(run_root, spec)
    yield run_root, info, port
    stop_judge(run_root)
    wait_for_sync(lambda: running_judge(run_root) is None, 30, "the judge ended")


def test_the_judge_serves_each_rank_and_node_in_prometheus_text_masked(metered):
    run_root, info, port = metered
    assert info["prometheus"] == {"url": "http://127.0.0.1:%d/metrics" % port}
    started = [e for e in events(run_root) if e["what"] == "judge"][0]
    assert "Prometheus metrics at http://127.0.0.1:%d/metrics" % port in started["text"]
    n0, n1 = FakeNode(info["port"], "node0", {}), FakeNode(info["port"], "node1", {})
    n0.send({"k": "file", "f": 1, "rank": 0}, {"k": "file", "f": 2, "rank": 1})
    n1.send({"k": "file", "f": 1, "rank": 2})
    n0.send({"k": "metric", "f": 1, "step": 7, "loss": 2.5, "tok_s": 1200.0},
            {"k": "metric", "f": 2, "step": 7, "loss": float("nan"), "tok_s": 1100},
            {"k": "telemetry", "gpu": {"gpus": [
                {"index": 0, "util": 87, "mem_used": 3 << 30, "mem_total": 80 << 30},
                {"index": 1, "util": "x", "mem_used": -5, "mem_total": True}]}},
            {"k": "ckpt_done", "f": 1, "step": 5, "complete": True},
            {"k": "ckpt_done", "f": 1, "step": 6, "complete": False})
    n1.send({"k": "metric", "f": 1, "step": 6, "loss": 2.75})
    n1.line.send({"t": "state", "state": {"state": "running", "restarts": 2}})
    n0.line.send({"t": "state", "state": {"state": "running", "restarts": 0}})

    def node(name, host, **more):
        return tuple(sorted(dict(run="run-1", node=name, host=host, **more).items()))
    masked = "****.example"
    def served():
        got = samples(port)
        return got if got.get(("rankdeck_node_restarts_total", node("node1", masked))) == 2 \
            and ("rankdeck_rank_step", node("node1", masked, rank="2")) in got else None
    got = wait_for_sync(served, 30, "node1's restarts and rank 2's step served")
    assert got[("rankdeck_rank_step", node("node0", "10.0.0.1", rank="0"))] == 7
    assert got[("rankdeck_rank_step", node("node1", masked, rank="2"))] == 6
    assert got[("rankdeck_rank_loss", node("node0", "10.0.0.1", rank="0"))] == 2.5
    assert math.isnan(got[("rankdeck_rank_loss", node("node0", "10.0.0.1", rank="1"))])
    assert got[("rankdeck_rank_tokens_per_second", node("node0", "10.0.0.1", rank="1"))] == 1100
    assert got[("rankdeck_rank_stalled", node("node0", "10.0.0.1", rank="0"))] == 0
    assert got[("rankdeck_node_up", node("node0", "10.0.0.1"))] == 1
    assert got[("rankdeck_node_restarts_total", node("node0", "10.0.0.1"))] == 0
    assert got[("rankdeck_node_gpu_utilization", node("node0", "10.0.0.1", gpu="0"))] == 0.87
    assert got[("rankdeck_node_gpu_memory_used_bytes", node("node0", "10.0.0.1", gpu="0"))] \
        == 3 << 30
    # a host's nonsense is left out, not served
    assert ("rankdeck_node_gpu_utilization", node("node0", "10.0.0.1", gpu="1")) not in got
    assert ("rankdeck_node_gpu_memory_used_bytes", node("node0", "10.0.0.1", gpu="1")) \
        not in got
    assert got[("rankdeck_checkpoint_last_step", (("run", "run-1"),))] == 5
    _status, _headers, body = get(port)
    assert SECRET.encode() not in body
    # the ranks stall (no step for 2 s): 1, every one
    wait_for_sync(lambda: all(v == 1 for (name, _l), v in samples(port).items()
                              if name == "rankdeck_rank_stalled"), 30, "every rank stalled")
    # a node whose supervisor is gone is down
    n1.line.close()
    wait_for_sync(lambda: samples(port)[("rankdeck_node_up", node("node1", masked))] == 0, 30,
                  "node1 down")


def test_the_endpoint_answers_get_of_metrics_only_and_few_at_once(metered):
    _run_root, _info, port = metered
    assert get(port)[0] == 200
    status, headers, body = get(port, "HEAD")
    assert status == 200 and body == b""
    assert get(port, "POST")[0] == 405
    assert get(port, path="/")[0] == 404
    assert get(port, path="/metrics/../etc/passwd")[0] == 404
    with socket.create_connection(("127.0.0.1", port), timeout=10) as big:
        big.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 20000 + b"\r\n\r\n")
        assert big.recv(64).startswith(b"HTTP/1.1 431"), "an oversized request refused"
    # MAX_SCRAPES connections that send nothing hold every slot: one more is closed unanswered
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_SCRAPES)]
    try:
        def refused() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                extra.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                try:
                    return extra.recv(64) == b""
                except ConnectionResetError:
                    return True
        assert refused()
    finally:
        for conn in idle:
            conn.close()
    # and once they are gone (or cut off after their time), scrapes are answered again
    wait_for_sync(lambda: get(port)[0] == 200, 30, "a scrape answered again")


def test_a_port_in_use_leaves_the_run_judged_and_says_why(tmp_path):
    run_root = str(tmp_path / "run")
    os.makedirs(run_root)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        info = start_judge(run_root, {"addr": "127.0.0.1", "token": TOKEN, "nodes": ["node0"],
                                      "prometheus": {"addr": "127.0.0.1", "port": port}})
        try:
            assert "cannot listen on http://127.0.0.1:%d/metrics" % port \
                in info["prometheus"]["error"]
            started = wait_for_sync(lambda: [e for e in events(run_root)
                                             if e["what"] == "judge"], 30, "the judge started")
            assert "no Prometheus metrics: cannot listen" in started[0]["text"]
        finally:
            stop_judge(run_root)


def test_the_judge_serves_the_runs_goodput_and_writes_its_report(metered):
    """The judge's goodput (agent/judge/goodput.py), fed live from its nodes' records and its own
    events: `rankdeck_run_goodput` and the work at risk served; its report written into the run's
    folder, owner-only, and read back by serve's `goodput` request."""
    run_root, info, port = metered
    now = time.time()
    n0 = FakeNode(info["port"], "node0", {})
    n0.send({"k": "event", "what": "launched", "ts": now - 100.0},
            {"k": "file", "f": 1, "rank": 0, "ts": now - 100.0},
            {"k": "file", "f": 2, "rank": 1, "ts": now - 100.0})
    n0.send(*[{"k": "metric", "f": f, "step": s, "loss": 1.0, "ts": now - 90.0 + s}
              for s in range(1, 91) for f in (1, 2)])
    n0.send({"k": "ckpt", "f": 1, "step": 80, "path": "/c/80", "ts": now - 9.5},
            {"k": "ckpt_done", "f": 1, "step": 80, "path": "/c/80", "complete": True,
             "ts": now - 9.0})
    run = (("run", "run-1"),)

    def served():
        got = samples(port)
        return got if got.get(("rankdeck_run_work_at_risk_gpu_seconds", run)) else None
    got = wait_for_sync(served, 30, "the run's goodput served")
    # 11 s of start-up (step 1 at -89 s), then stepping: the share that trained so far
    assert 0.75 < got[("rankdeck_run_goodput", run)] < 0.95, got
    # 2 ranks since checkpoint 80's line, about 10 s ago (the scrape is a little later)
    assert 2 * 9.0 < got[("rankdeck_run_work_at_risk_gpu_seconds", run)] < 2 * 40
    stop_judge(run_root)  # the judge's last report, as it ends
    path = os.path.join(run_root, "judge", "goodput.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    answer = Server(out=io.BytesIO()).op_goodput({"run_root": run_root})
    report = answer["report"]
    assert report["ranks"] == 2 and report["clock"] == "judge" and not report["ended"], report
    assert report["buckets"]["start-up"] == pytest.approx(11.0, abs=0.01)
    assert sum(report["buckets"].values()) == pytest.approx(report["wall_s"], abs=0.01)
    assert abs(answer["now"] - answer["written"]) < 60
    # what a console makes of it: the judge's, checked; a host's nonsense is no report
    assert from_judge(answer)["source"] == "judge"
    assert from_judge(dict(answer, report=dict(report, wall_s="1e9"))) is None
    assert from_judge(dict(answer, written=answer["now"] - 600)) is None  # gone stale
