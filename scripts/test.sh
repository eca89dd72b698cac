#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the test suite: pytest [ARGS...].
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
python -m pytest "$@"
