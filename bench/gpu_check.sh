#!/usr/bin/env bash
# The checks that need a GPU, as one script for a GPU host with no package
# registry (docs/GPU.md): the console's wheels travel in .whl/, made on the laptop with
# `pip download` (see docs/GPU.md). Run from the repo root; writes logs and the view's SVG
# under $OUT. Each step prints a "== step: rc" line; a failing step does not stop the others.
#
#     OUT=/tmp/gpu-out bash bench/gpu_check.sh [STEPS]
set -u
OUT=${OUT:-/tmp/gpu-out}
STEPS=${1:-120}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HOME=${HOME:-/root}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
    >"$OUT/pip.log" 2>&1 || { echo "== wheels: failed"; tail -5 "$OUT/pip.log"; }
export PYTHONPATH=/tmp/site:$PWD
rd() { python3 -m console "$@"; }
step() { local name=$1; shift; "$@"; echo "== $name: rc $?"; }

nvidia-smi -L
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
for pkg in deepspeed accelerate pynvml; do
    python3 -c "import $pkg; print('$pkg', getattr($pkg, '__version__', 'present'))" 2>&1 | tail -1
done

# the NVML probe on a real GPU
step real_host python3 -m pytest -q -p no:cacheprovider -k real_host tests/agent/test_gpu.py

# one GPU: one rank on one node (two ranks on one GPU is an NCCL error)
cat >/tmp/gpu-inv.yaml <<'EOF'
name: gpu-host
transport: local
defaults: {workdir: ., slots: 1}
hosts:
  - {name: node0, addr: 127.0.0.2}
EOF

# the reference trainer on cuda/NCCL under each launcher that one GPU allows, to the end, then
# the GPU's memory
# (not accelerate: its multi-machine mode needs 2 processes or more, and two ranks on one GPU
# is an NCCL error; one GPU host cannot run it on cuda)
for pair in torchrun:trainer/train.py deepspeed:trainer/ds_train.py; do
    launcher=${pair%%:*}; script=${pair#*:}
    timeout 150 python3 -m console launch -i /tmp/gpu-inv.yaml --launcher "$launcher" --env PYTHONPATH=/tmp/site --no-tui \
        "$script" -- --steps "$STEPS" --device cuda --ckpt-every 50 >"$OUT/$launcher.log" 2>&1
    echo "== launch $launcher: rc $?"
    grep -E "step [0-9]+ .*loss" "$OUT/$launcher.log" | tail -2
    tail -6 "$OUT/$launcher.log"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
done

# the view's GPU panel: a detached run, `attach` in a pseudo-terminal, Textual's own screenshot
run_id=$(timeout 120 python3 -m console launch -i /tmp/gpu-inv.yaml --detach trainer/train.py -- \
    --steps 3000 --device cuda --precision bf16 --d-model 512 --layers 6 --heads 8 --seq-len 256 \
    --batch-size 32 2>"$OUT/detach.err" | tail -1)
echo "== detached run: $run_id"
sleep 20
python3 - "$run_id" "$OUT" <<'EOF'
import fcntl, os, pty, struct, sys, termios, time
run_id, out = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(TERM="xterm-256color", TEXTUAL_SCREENSHOT="15",
                      TEXTUAL_SCREENSHOT_LOCATION=out, TEXTUAL_SCREENSHOT_FILENAME="gpu-view.svg")
    os.execvp(sys.executable, [sys.executable, "-m", "console", "attach", run_id])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
deadline = time.time() + 40
while time.time() < deadline:
    try:
        if not os.read(fd, 65536):
            break
    except OSError:
        break
try:
    os.kill(pid, 15)
except ProcessLookupError:
    pass
print("screenshot:", os.path.exists(os.path.join(out, "gpu-view.svg")))
EOF
step status rd status "$run_id" --json >"$OUT/status.json"
step stop rd stop "$run_id"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader

# last, the agent's CPU with NVML on (a 60 s window; docs/BENCHMARKS.md)
step agent_cpu timeout 150 python3 bench/agent_cpu.py --seconds 60 --no-idle
echo "== done"
