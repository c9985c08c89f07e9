"""The reference trainer, run as the console runs it: a subprocess, plain or under torchrun.

Each test asserts on the stdout lines the console parses, the files left on disk and the exit
code. The model is the default tiny one; runs take a few seconds, most of it importing torch.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.spine.helpers import HOST_PYTHON

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "trainer" / "train.py"

STEP_RE = re.compile(
    r"^step=(\d+) loss=(-?\d+\.\d{4}|nan|inf) lr=(\d\.\d{3}e[+-]\d\d) step_time=(\d+\.\d{4}) tok/s=(\d+)$"
)
START_RE = re.compile(r"^rank=(\d+) local_rank=(\d+) world_size=(\d+) device=(\S+) pid=(\d+)$")
SAVED_RE = re.compile(r"^checkpoint saved step=(\d+) path=(/\S+) bytes=(\d+)$")
RESUMED_RE = re.compile(r"^resumed step=(\d+) from=(/\S+)$")


def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RANKDECK_CKPT_DIR", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # the machine has 2 cores, shared with other tests
    return env


def run_trainer(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HOST_PYTHON, str(TRAIN), *args],
        cwd=cwd, env=trainer_env(), capture_output=True, text=True, timeout=timeout,
    )


def parse_steps(stdout: str) -> list[tuple[int, float, float, float, int]]:
    steps = []
    for line in stdout.splitlines():
        if line.startswith("step="):
            m = STEP_RE.match(line)
            assert m, f"malformed step line: {line!r}"
            steps.append((int(m[1]), float(m[2]), float(m[3]), float(m[4]), int(m[5])))
    return steps


def matches(regex: re.Pattern, stdout: str) -> list[re.Match]:
    return [m for m in map(regex.match, stdout.splitlines()) if m]


def test_single_process_trains_logs_and_checkpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_trainer("--steps", "30", "--ckpt-dir", str(ckpt), "--ckpt-every", "10",
                       "--keep-ckpts", "2", "--warmup-steps", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    start = matches(START_RE, proc.stdout)
    assert len(start) == 1
    assert start[0].group(1, 2, 3, 4) == ("0", "0", "1", "cpu")
    assert int(start[0][5]) > 0

    steps = parse_steps(proc.stdout)
    assert [s[0] for s in steps] == list(range(1, 31))
    losses = [s[1] for s in steps]
    assert all(math.isfinite(x) for x in losses)
    # Starts near ln(256) = 5.55 and must have learnt something by the end.
    assert 5.0 < sum(losses[:3]) / 3 < 6.0
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2
    assert all(s[3] > 0 and s[4] > 0 for s in steps)
    assert steps[0][2] == pytest.approx(1e-3 / 5)  # warmup starts at lr / warmup_steps

    saved = matches(SAVED_RE, proc.stdout)
    assert [int(m[1]) for m in saved] == [10, 20, 30]
    for m in saved:
        assert Path(m[2]).parent == ckpt
    # keep-ckpts 2: step 10 pruned; no temporary file left behind.
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000020.pt", "step_00000030.pt"]
    assert int(saved[-1][3]) == (ckpt / "step_00000030.pt").stat().st_size
    assert proc.stdout.splitlines()[-1] == "done steps=30"
    assert not matches(RESUMED_RE, proc.stdout)


def test_resume_continues_after_newest_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = run_trainer("--steps", "10", "--ckpt-dir", str(ckpt), "--ckpt-every", "5", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert [int(m[1]) for m in matches(SAVED_RE, first.stdout)] == [5, 10]
    last_loss = parse_steps(first.stdout)[-1][1]

    second = run_trainer("--steps", "15", "--ckpt-dir", str(ckpt), "--ckpt-every", "5", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    resumed = matches(RESUMED_RE, second.stdout)
    assert [(int(m[1]), m[2]) for m in resumed] == [(10, str(ckpt / "step_00000010.pt"))]
    steps = parse_steps(second.stdout)
    assert [s[0] for s in steps] == list(range(11, 16))
    # Weights came back: no jump back up to the untrained loss of about 5.55.
    assert steps[0][1] < last_loss + 0.05
    assert [int(m[1]) for m in matches(SAVED_RE, second.stdout)] == [15]

    # Bit-for-bit the run that was never interrupted: same weights, optimizer moments, schedule
    # (steps 1-10 are all warmup, so --steps 10 and 15 agree there) and data position.
    straight = run_trainer("--steps", "15", "--ckpt-dir", str(tmp_path / "straight"), cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr
    assert [s[:3] for s in parse_steps(straight.stdout)[10:]] == [s[:3] for s in steps]


def test_text_file_data_and_ckpt_dir_from_env(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 200)
    env = trainer_env()
    env["RANKDECK_CKPT_DIR"] = str(tmp_path / "from-env")
    proc = subprocess.run([HOST_PYTHON, str(TRAIN), "--steps", "3", "--data", str(corpus)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [s[0] for s in parse_steps(proc.stdout)] == [1, 2, 3]
    assert (tmp_path / "from-env" / "step_00000003.pt").is_file()
    assert not (tmp_path / "checkpoints").exists()


def test_bad_flags_fail_with_one_error_line(tmp_path):
    proc = run_trainer("--data", str(tmp_path / "missing.txt"), "--ckpt-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert "error: --data" in proc.stderr and "No such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_slow_rank_turns_slow_at_the_step_asked_and_says_so_once(tmp_path):
    # bench/stuck.py times a straggler from this line: the steps before it are the clean pace
    proc = run_trainer("--steps", "4", "--ckpt-every", "0", "--slow-rank", "0", "--slow-s", "0.01",
                       "--slow-at-step", "3", "--ckpt-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [s[0] for s in parse_steps(proc.stdout)] == [1, 2, 3, 4]
    said = [line for line in proc.stderr.splitlines() if "fault injected" in line]
    assert said == ["fault injected kind=slow step=3 rank=0"], proc.stderr


def test_sigterm_saves_checkpoint_and_exits_143(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [HOST_PYTHON, str(TRAIN), "--steps", "100000", "--ckpt-dir", str(ckpt), "--ckpt-every", "0"],
        cwd=tmp_path, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines = []
        while not any(line.startswith("step=3 ") for line in lines):
            line = proc.stdout.readline()
            assert line, f"trainer exited early: {proc.wait()} {proc.stderr.read()}"
            lines.append(line.rstrip("\n"))
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    out = "\n".join(lines) + "\n" + rest
    last_step = parse_steps(out)[-1][0]
    assert last_step < 100000
    saved = matches(SAVED_RE, out)
    assert [int(m[1]) for m in saved] == [last_step]  # the step it finished, and only on SIGTERM
    assert Path(saved[0][2]).is_file()
    assert "done steps" not in out


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_steps_on_cpu(tmp_path, precision):
    # torch 2.13 supports both dtypes in CPU autocast (fp16 about 5x slower than fp32 there).
    proc = run_trainer("--steps", "2", "--precision", precision, "--ckpt-dir", str(tmp_path),
                       "--clip-grad", "1.0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = parse_steps(proc.stdout)
    assert [s[0] for s in steps] == [1, 2]
    assert all(math.isfinite(s[1]) for s in steps)


def test_cuda_without_gpu_fails_cleanly(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    proc = run_trainer("--device", "cuda", "--steps", "1", "--ckpt-dir", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- torchrun ----------------------------------------------------------------------------


def torchrun(tmp_path: Path, *args: str, torchrun_args: tuple[str, ...] = (),
             env_extra: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = trainer_env()
    env.update(env_extra or {})
    return subprocess.run(
        [HOST_PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--log-dir", str(tmp_path / "logs"), "-r", "3", *torchrun_args, str(TRAIN), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )


def worker_logs(tmp_path: Path, attempt: int, local_rank: int, name: str) -> Path:
    found = list((tmp_path / "logs").glob(f"*/attempt_{attempt}/{local_rank}/{name}"))
    assert len(found) == 1, f"expected one {name} for attempt {attempt} rank {local_rank}: {found}"
    return found[0]


@pytest.mark.e2e
def test_torchrun_injected_crash_is_the_root_cause(tmp_path):
    proc = torchrun(tmp_path, "--steps", "6", "--ckpt-dir", str(tmp_path / "ckpt"),
                    "--crash-at-step", "3", "--crash-rank", "1")
    assert proc.returncode != 0
    error_json = worker_logs(tmp_path, 0, 1, "error.json").read_text()
    assert "injected crash at step 3 on rank 1" in error_json
    assert "RuntimeError: injected crash at step 3 on rank 1" in proc.stderr  # torchrun's summary
    rank1 = worker_logs(tmp_path, 0, 1, "stdout.log").read_text()
    assert [s[0] for s in parse_steps(rank1)] == [1, 2]
    assert (tmp_path / "ckpt" / ".fault-fired-crash-3-1").exists()


@pytest.mark.e2e
def test_torchrun_restart_resumes_and_does_not_crash_again(tmp_path):
    # The shared rendezvous store breaks gloo re-initialisation after a restart under torch
    # 2.13 (pytorch/pytorch#135712): without this variable attempt 1 times out in connectFullMesh.
    proc = torchrun(tmp_path, "--steps", "6", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "2",
                    "--crash-at-step", "3", "--crash-rank", "1",
                    torchrun_args=("--max-restarts", "1"),
                    env_extra={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "injected crash at step 3 on rank 1" in worker_logs(tmp_path, 0, 1, "error.json").read_text()
    for local_rank in (0, 1):
        out = worker_logs(tmp_path, 1, local_rank, "stdout.log").read_text()
        resumed = matches(RESUMED_RE, out)
        assert [int(m[1]) for m in resumed] == [2]
        assert [s[0] for s in parse_steps(out)] == [3, 4, 5, 6]
        assert out.splitlines()[-1] == "done steps=6"
    # Only local rank 0 writes checkpoints.
    assert not matches(SAVED_RE, worker_logs(tmp_path, 1, 1, "stdout.log").read_text())
    assert (tmp_path / "ckpt" / "step_00000006.pt").is_file()


@pytest.mark.e2e
def test_torchrun_hang_surfaces_within_pg_timeout(tmp_path):
    # Rank 1 hangs before step 3: rank 0's allreduce must fail after --pg-timeout (not gloo's
    # 30 minutes), and when torchrun then SIGTERMs the hung rank, the watchdog ends it after
    # --term-grace with a stack dump instead of torchrun's 30 s wait for SIGKILL. gloo's own
    # timeout would not end within torchrun()'s deadline: the run ending at all is the check.
    proc = torchrun(tmp_path, "--steps", "6", "--ckpt-dir", str(tmp_path / "ckpt"),
                    "--hang-at-step", "3", "--hang-rank", "1", "--pg-timeout", "5", "--term-grace", "2")
    assert proc.returncode != 0
    assert "Timed out" in worker_logs(tmp_path, 0, 0, "error.json").read_text()
    hung = worker_logs(tmp_path, 0, 1, "stderr.log").read_text()
    assert "fault injected kind=hang step=3 rank=1" in hung
    assert "SIGTERM: no step boundary reached within 2s" in hung
    assert "in injected_hang" in hung  # the stack dump shows where it was stuck


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_two_nodes_resume_from_the_node_that_has_the_checkpoint(tmp_path):
    # Two torchrun agents on this host, each with its own checkpoint directory, as two hosts
    # without a shared filesystem. Only node A has a checkpoint; both ranks must resume from it.
    dir_a, dir_b = tmp_path / "node-a", tmp_path / "node-b"
    seed = run_trainer("--steps", "4", "--ckpt-dir", str(dir_a), cwd=tmp_path)
    assert seed.returncode == 0, seed.stderr
    dir_b.mkdir()
    port = free_port()
    agents = []
    for name, ckpt in (("a", dir_a), ("b", dir_b)):
        env = trainer_env()
        env["RANKDECK_CKPT_DIR"] = str(ckpt)
        agents.append(subprocess.Popen(
            [HOST_PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
             "--log-dir", str(tmp_path / f"logs-{name}"), "-r", "3", str(TRAIN), "--steps", "6"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    try:
        results = [agent.communicate(timeout=120) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    for agent, (_, err) in zip(agents, results):
        assert agent.returncode == 0, err[-3000:]
    source = str(dir_a / "step_00000004.pt")
    for name, ckpt in (("a", dir_a), ("b", dir_b)):
        out = next((tmp_path / f"logs-{name}").glob("*/attempt_0/0/stdout.log")).read_text()
        assert [(int(m[1]), m[2]) for m in matches(RESUMED_RE, out)] == [(4, source)]
        assert [s[0] for s in parse_steps(out)] == [5, 6]
        saved = matches(SAVED_RE, out)
        assert [(int(m[1]), m[2]) for m in saved] == [(6, str(ckpt / "step_00000006.pt"))]
    # Same state on both nodes: identical final checkpoints.
    assert (dir_a / "step_00000006.pt").read_bytes() == (dir_b / "step_00000006.pt").read_bytes()


def test_ddp_buffer_sync_keyword_fits_the_installed_torch_and_older_ones():
    """torch 2.11 raised TypeError on `forward_sync_buffers` (a 2.13 name) at DDP construction
    on every rank (seen on an H100 host): the trainer picks the name this torch has."""
    from torch.nn.parallel import DistributedDataParallel

    from trainer.train import no_buffer_sync

    class OlderDDP:  # DDP's signature before torch 2.13
        def __init__(self, module, device_ids=None, broadcast_buffers=True):
            pass

    assert no_buffer_sync(OlderDDP) == {"broadcast_buffers": False}
    kwargs = no_buffer_sync(DistributedDataParallel)
    assert kwargs in ({"forward_sync_buffers": False}, {"broadcast_buffers": False})
    assert list(kwargs)[0] in __import__("inspect").signature(
        DistributedDataParallel.__init__).parameters
