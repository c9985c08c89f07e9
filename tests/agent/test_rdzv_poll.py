"""torchrun's rendezvous polled every 0.25 s (agent/torchrun/rdzv_poll.py, armed by the node's hook).

Each probe is a real Python with the hook folder the supervisor makes (agent/torchrun/hooks.py) on
its path that imports torch's real ``dynamic_rendezvous`` there: what it prints is what
torchrun would get. The module starts every probe at once; each test reads its own. ``time.sleep`` is replaced in that process to record the waits asked of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.torchrun import hooks, rdzv_poll

PROBE = """\
import json, time
import torch.distributed.elastic.rendezvous.dynamic_rendezvous as d
waits = []
time.sleep = waits.append
d._delay(seconds=1)         # the op executor's wait for other nodes
d._delay(seconds=(0, 0.3))  # a first join's skew: torch's own
holder = d._BackendRendezvousStateHolder(None, None)
print(json.dumps({"poll": getattr(d._delay, "rankdeck_poll", None), "waits": waits,
                  "kept": holder._cache_duration}))
"""


# Every probe of this module, by name: (the run's environment, whether as a worker). Each
# imports torch (seconds of CPU), so the module starts them all at once (PROBES below) and
# each test reads its own; a probe's folder is its own, as a node's is.
PROBE_ENVS = {
    "default": ({}, False),
    "half": ({rdzv_poll.VAR: "0.5"}, False),
    "torchs own": ({rdzv_poll.VAR: "0"}, False),
    "worker": ({}, True),
    "no flight recorder": ({"RANKDECK_FLIGHT_RECORDER": "0"}, False),
}


def start_probe(folder, run_env: dict, worker: bool = False) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK")}
    env.pop(rdzv_poll.VAR, None)
    env.update(run_env)
    hooks.install(str(folder / "node"), env)
    if worker:
        env.update(LOCAL_RANK="0", RANK="0")
    return subprocess.Popen([sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """``probes(name)``: what the probe of PROBE_ENVS[name] printed, and its folder."""
    started = {}
    for name, (run_env, worker) in PROBE_ENVS.items():
        folder = tmp_path_factory.mktemp("probe")
        started[name] = (start_probe(folder, run_env, worker), folder)
    done = {}

    def result(name: str) -> tuple[dict, object]:
        if name not in done:
            proc, folder = started[name]
            # (the 120 s one probe had, for each: they share the CPU until the last ends)
            out, err = proc.communicate(timeout=120 * len(PROBE_ENVS))
            assert proc.returncode == 0, err[-3000:]
            done[name] = (json.loads(out.strip().splitlines()[-1]), folder)
        return done[name]
    yield result
    for proc, _folder in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def probe(probes, name: str) -> dict:
    return probes(name)[0]


def test_torchruns_one_second_wait_and_kept_state_become_a_quarter_and_its_skew_stays(probes):
    got = probe(probes, "default")
    assert (got["poll"], got["kept"]) == (0.25, 0.25)
    assert got["waits"][0] == 0.25
    assert len(got["waits"]) in (1, 2)  # the skew: torch's own random 0-0.3 s (<10 ms: none)
    assert all(0 <= w <= 0.3 for w in got["waits"][1:])


def test_the_run_may_ask_for_another_poll_or_torchs_own(probes, tmp_path):
    assert probe(probes, "half")["waits"][0] == 0.5
    kept = probe(probes, "torchs own")
    assert (kept["poll"], kept["waits"][0], kept["kept"]) == (None, 1, 1)
    # with the flight recorder off as well, nothing is put on the path
    env = {"RANKDECK_FLIGHT_RECORDER": "0", rdzv_poll.VAR: "0"}
    assert hooks.install(str(tmp_path / "c"), dict(env)) is None
    assert not (tmp_path / "c" / hooks.HOOK_DIR).exists()


def test_workers_are_left_alone(probes):
    got = probe(probes, "worker")
    assert (got["poll"], got["waits"][0], got["kept"]) == (None, 1, 1)


def test_the_poll_alone_without_the_flight_recorder(probes):
    got, folder = probes("no flight recorder")
    assert got["poll"] == 0.25
    assert sorted(os.listdir(folder / "node" / hooks.HOOK_DIR)) == [
        rdzv_poll.MODULE + ".py", "sitecustomize.py"]
    assert not (folder / "node" / "fr").exists()


def test_a_torch_without_the_function_is_left_alone():
    class Module:
        pass

    class Holder:
        def __init__(self, cache_duration=1):
            self._cache_duration = cache_duration

    assert rdzv_poll.patch(Module(), 0.25) is False
    m = Module()
    m._delay = lambda seconds: seconds
    assert rdzv_poll.patch(m, 0.25) is False  # no state holder: neither is changed
    assert m._delay(1) == 1
    m._BackendRendezvousStateHolder = Holder
    assert rdzv_poll.patch(m, 0.25) is True
    assert (m._delay(1), m._delay(seconds=1), m._delay(2)) == (0.25, 0.25, 2)
    assert (Holder()._cache_duration, Holder(0)._cache_duration) == (0.25, 0)
    assert rdzv_poll.patch(m, 0.1) is False  # patched once
    assert [rdzv_poll.seconds({rdzv_poll.VAR: v}) for v in ("x", "1", "-1", "0.1")] == [
        None, None, None, 0.1]
