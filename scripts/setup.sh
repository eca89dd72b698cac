#!/usr/bin/env bash
# Set up lmrepro from a clean clone: a virtual environment in .venv with the CPU build of torch
# (installed first, so the project's torch range never pulls a multi-GB CUDA build), the project
# with its dev extras, the embedded offline corpus under data/embedded/, and the page that
# `dvc plots show` renders into (vega inlined from an installed package: no CDN). Idempotent.
#   LMREPRO_PYTHON  interpreter to build .venv from (default: python3, must be >= 3.11)
#   LMREPRO_TORCH   torch requirement installed first (default: torch==2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${LMREPRO_PYTHON:-python3}
TORCH=${LMREPRO_TORCH:-torch==2.13.0}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "lmrepro needs Python >= 3.11, found " + sys.version.split()[0])'
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PY"
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  echo "setup: installing $TORCH"
  "${PIP[@]}" "$TORCH"
fi
echo "setup: installing lmrepro[dev] (editable)"
"${PIP[@]}" -e ".[dev]"
echo "setup: installing the embedded offline corpus into data/embedded/"
.venv/bin/lmrepro install-corpus --dest data/embedded
echo "setup: writing .dvc/plots.html (dvc plots show without the network)"
.venv/bin/python -m lmrepro.pipeline.dvcplots
echo "setup: done (.venv/bin/lmrepro, .venv/bin/dvc, .venv/bin/python)"
