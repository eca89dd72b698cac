#!/usr/bin/env bash
# SCAPE's training-length study on one GPU at a larger size (profile `scaling_gpu`; minutes on an
# H200): prepares the embedded corpus, runs `lmrepro scaling --profile scaling_gpu` (finished
# runs are skipped), then packs the small products (summaries, per-batch eval losses, metrics;
# no checkpoints or models) into DEST/scaling_gpu.tgz for `lmrepro` to analyse elsewhere.
#
#   bash scripts/gpu-scaling.sh DEST [LIMIT_S]     # PYTHON=/path/to/python to choose it
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
DEST="${1:?usage: gpu-scaling.sh DEST [LIMIT_S]}"
LIMIT="${2:-420}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m lmrepro prepare --profile scaling_gpu
rc=0
timeout "$LIMIT" "$PY" -m lmrepro scaling --profile scaling_gpu --out results/scaling_gpu || rc=$?
find results/scaling_gpu \( -name summary.json -o -name 'eval_losses*.json' -o -name metrics.jsonl \
  -o -name identity.json -o -name plan.json -o -name sweep.json \) -not -path '*/checkpoints/*' \
  | tar czf "$DEST/scaling_gpu.tgz" -T -
echo "gpu-scaling: study exit status $rc; packed $(tar tzf "$DEST/scaling_gpu.tgz" | wc -l) files"
exit "$rc"
