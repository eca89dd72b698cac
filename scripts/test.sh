#!/usr/bin/env bash
# Set up (scripts/setup.sh), then the checks: the linter (ruff), the type checker (mypy, on the
# modules listed in pyproject.toml), and the test suite: pytest [ARGS...]. By default the tests
# marked `slow` (multi-process and notebook tests, about two thirds of the time) are left out;
# `--all` as the first argument runs them too, as CI (.ci/run) does.
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
  select=()
  shift
fi
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "test: ruff check"
ruff check src tests bench
echo "test: mypy"
mypy
python -m pytest "${select[@]}" "$@"
