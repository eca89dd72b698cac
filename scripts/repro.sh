#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the default pipeline offline: dvc repro [ARGS...].
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
dvc repro "$@"
echo "repro: reports in reports/index.html; metrics: dvc metrics show"
