#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the pipeline offline: dvc repro [ARGS...].
#   bash scripts/repro.sh                      # the profile named in params.yaml (default)
#   LMREPRO_PROFILE=scaling bash scripts/repro.sh   # another profile, params.yaml untouched
# The validate stage runs first, forced: it writes the active profile's parameters to
# results/params.json, which every other stage depends on (DVC cannot see the variable itself).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
dvc repro --force --single-item validate
dvc repro "$@"
echo "repro: reports in reports/index.html; metrics: dvc metrics show"
