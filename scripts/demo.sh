#!/usr/bin/env bash
# The demo: the live view on a 4-node run of the reference trainer on this machine.
# Sets itself up first (a .venv in the checkout); no SSH needed. Extra args go to
# `rankdeck demo` (e.g. --no-tui, --steps 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/rankdeck demo "$@"
