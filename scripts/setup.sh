#!/usr/bin/env bash
# Make .venv with rankdeck (editable), the reference trainer's torch (pinned: an unpinned
# torch pulls GBs of CUDA packages) and, with --test, what the test suite needs: Debian's
# openssh-server, pdsh, tmux, iproute2, rsync, python3-venv, prometheus and Slurm with munge
# (as root), and the Python test tools: among them (the test extras, pinned by constraints.txt)
# mlflow (a real `mlflow server` for tests/spine/test_trackers.py) and wandb, about 75 s more
# for a fresh setup on the 2-core test machine (docs/EXPORTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ "$want_test" = 1 ] && [ "$(id -u)" = 0 ]; then
  missing=()
  command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
  command -v pdsh >/dev/null 2>&1 || missing+=(pdsh)
  command -v tmux >/dev/null 2>&1 || missing+=(tmux)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  command -v rsync >/dev/null 2>&1 || missing+=(rsync)  # bench/sync.py's baseline
  # the SSH test hosts' own Python is a venv made from Debian's python3 (tests/e2e/sshhosts.py)
  /usr/bin/python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # a real Prometheus and its promtool scrape a run's --prometheus
  # (tests/spine/test_prometheus.py); not its node exporter (recommended), no service started
  if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    echo "installing prometheus ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
  # a real Slurm for tests/slurm (tests/slurm/slurmcluster.py starts its own daemons; the
  # packages' init scripts do nothing without /etc/slurm/slurm.conf)
  slurm=()
  [ -x /usr/sbin/slurmctld ] || slurm+=(slurmctld)
  [ -x /usr/sbin/slurmd ] || slurm+=(slurmd)
  command -v srun >/dev/null 2>&1 || slurm+=(slurm-client)
  [ -x /usr/sbin/munged ] || slurm+=(munge)
  if [ "${#slurm[@]}" -gt 0 ]; then
    echo "installing ${slurm[*]} ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${slurm[@]}" >/dev/null
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
extras="trainer"
[ "$want_test" = 1 ] && extras="trainer,test"
stamp=".venv/.rankdeck-$extras-$(sha256sum pyproject.toml | cut -c1-12)"
if [ ! -e "$stamp" ]; then
  # DeepSpeed (the test extras' launchers) is built from its sdist: without its compiled ops,
  # which would need a CUDA toolkit; the ops it needs on CPU it builds at first use
  DS_BUILD_OPS=0 .venv/bin/pip install -q -c constraints.txt -e ".[$extras]"
  touch "$stamp"
fi
