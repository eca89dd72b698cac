#!/usr/bin/env bash
# Set up (scripts/setup.sh), then the checks: the linter (ruff), the type checker (mypy, on the
# modules listed in pyproject.toml), and the test suite: pytest [ARGS...].
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "test: ruff check"
ruff check src tests bench
echo "test: mypy"
mypy
python -m pytest "$@"
