#!/usr/bin/env bash
# RGC at the paper's shape with the paper's allocation scaled to a 16-core machine, in under
# 150 s of wall time: bench/bench_rgc_paper_shape.py with 4 async workers (one stage of 6 blocks
# each) of 4+4+3+3 threads, each worker's threads bound to its own cores, against global
# backprop at 12 threads bound to 12 cores (the paper: 29 worker threads against 24 on 31
# cores), STEPS steps each (the first a warm-up), then each stage's compute alone at 4 and at
# 3 threads (the 4 stages at once, each bound to its own cores, as the workers run).
# Installs nothing: it uses the machine's python (PYTHON=...) with torch, numpy,
# psutil, pydantic and pyyaml; it says which are missing and stops if any is.
#
#   bash scripts/rgc-paper-shape.sh              # results under $OUT if set, else bench/results
#   STEPS=3 LIMIT_S=140 bash scripts/rgc-paper-shape.sh
#   EXTRA_ARGS="--shrink 8" bash scripts/rgc-paper-shape.sh     # a smoke test of the script
#
# Writes rgc_paper_shape_16core.json and the run's log; prints a compact summary. Phases that
# would start after DEADLINE_S are skipped (and listed in the JSON), and the whole run is
# killed at LIMIT_S; the JSON is rewritten after every phase, so a cut run keeps what it did.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
STEPS="${STEPS:-3}"
LIMIT="${LIMIT_S:-140}"
DEADLINE="${DEADLINE_S:-110}"
DEST="${OUT:-$PWD/bench/results}"
mkdir -p "$DEST"
JSON="$DEST/rgc_paper_shape_16core.json"
LOG="$DEST/rgc_paper_shape_16core.log"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
t0=$(date +%s)

missing=$("$PY" - <<'PY' 2>&1
import importlib
print(" ".join(m for m in ("torch", "numpy", "psutil", "pydantic", "yaml")
               if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  echo "rgc-paper-shape: python $("$PY" -V 2>&1) lacks: $missing (this script installs nothing); stopped"
  exit 2
fi
cores=$(nproc)
echo "rgc-paper-shape: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $cores cores, torch $("$PY" -c 'import torch; print(torch.__version__, torch.get_num_threads())'), steps $STEPS, limit ${LIMIT}s"
if [ "$cores" -lt 14 ]; then
  echo "rgc-paper-shape: $cores cores < the 14 the workers' threads need; the benchmark will not bind threads"
fi

rc=0
timeout -k 5 "$LIMIT" "$PY" bench/bench_rgc_paper_shape.py --workers 4 \
  --threads-per-worker 4,4,3,3 --backprop-threads 12 --threads 4,3 --parallel-stages --steps "$STEPS" \
  --stage-repeats 1 --deadline-s "$DEADLINE" --json-out "$JSON" ${EXTRA_ARGS:-} > "$LOG" 2>&1 || rc=$?
grep -E '^  (backprop|async|account|stage|skipped)' "$LOG" | cut -c1-220
if [ "$rc" -ne 0 ]; then
  echo "rgc-paper-shape: benchmark exit status $rc (124: killed at ${LIMIT}s); last lines:"
  tail -n 15 "$LOG"
fi
"$PY" - "$JSON" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
runs = r.get("runs", {})
if "async" in runs and "backprop" in runs:
    a, b = runs["async"], runs["backprop"]
    ta, tb = a["summary"]["tokens_per_s"], b["summary"]["tokens_per_s"]
    print(f"summary: async/backprop tokens/s = {ta / tb:.3f} ({ta:.0f} / {tb:.0f}); "
          f"peak PSS {a['summary']['peak_pss_bytes'] / 2**20:.0f} / "
          f"{b['summary']['peak_pss_bytes'] / 2**20:.0f} MiB; pinned: "
          f"{a['pinning'].get('pinned')} / {b['pinning'].get('pinned')}")
print(f"summary: skipped {r.get('skipped')}; benchmark wall {r.get('wall_s', 0):.0f} s")
PY
echo "rgc-paper-shape: wrote $JSON and $LOG in $(( $(date +%s) - t0 )) s"
exit "$rc"
