#!/usr/bin/env bash
# GPU check of the SCAPE wing, under 5 minutes: on a machine with CUDA it runs
# `python -m lmrepro.scape.train.gpu_check` under torchrun with the NCCL backend (one worker per
# GPU, at most GPU_CHECK_NPROC; world size 1 is enough), which checks the CUDA code paths of the
# optimizer library, SCAPE at sparsity 0 (dense) against AdamS on the GPU, and prints the step times and
# bytes of SCAPE and the dense baselines. Without CUDA it says so and exits 0 without running.
#
#   bash scripts/gpu-check.sh            # PYTHON=/path/to/python to choose the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: no CUDA device available to torch on $(hostname) (torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not importable')); nothing to check, exit 0"
  exit 0
fi

NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
NPROC="${GPU_CHECK_NPROC:-1}"
if [ "$NPROC" -gt "$NGPU" ]; then NPROC="$NGPU"; fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
echo "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), $NGPU GPU(s), $NPROC worker(s), NCCL"
exec timeout 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
  -m lmrepro.scape.train.gpu_check --device cuda "$@"
