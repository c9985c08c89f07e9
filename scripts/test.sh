#!/usr/bin/env bash
# The whole test suite. Sets itself up first (Debian packages as root, a .venv); the SSH and
# network-namespace tests need root and skip with the reason otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -ra --durations=30 "$@"
