#!/usr/bin/env bash
# One device call: the memory and profile stages' 2026 gpu grids, run directly (no Snakemake), with
# the arguments config/stages/{memory,profile}.yaml's gpu blocks give the rules. Writes CSVs, logs
# and the part (f) Nsight memory captures under $OUT; snapshots and profile captures stay in /tmp.
#   bash scripts/gpu/grids.sh   (on a GPU host, from the project root, with .libdw carried for nsys)
# Budget: about 5 minutes on an H100 (memory ~2-3 min, profile ~2-3 min); each stage is bounded by
# its own timeout (MEMORY_S, PROFILE_S, default 270 s each: at most 9 min). STAGES=memory or
# STAGES=profile runs one of them (two calls if one call runs long).
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
raw=/tmp/grids_raw; mkdir -p "$raw"
stages=${STAGES:-memory profile}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "nsys: ${NSYS:-$(command -v nsys || echo absent)}"
common="--machine h100-80gb-hbm3 --preset gpu"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grids_2026.py \
  > "$out/gpu_tests.txt" 2>&1
echo "gpu tests (part (f) on CUDA vs core.costs): exit $?; $(tail -1 "$out/gpu_tests.txt")"
if [[ " $stages " == *" memory "* ]]; then
  t0=$(date +%s)
  timeout ${MEMORY_S:-270} python3 -m cs336_systems.stages.memory run $common --size 2.7B \
    --contexts 128,2048 --modes forward,train_step --precisions fp32,bf16 --batch-size 4 \
    --warmup ${WARMUP:-2} --max-entries 200000 --raw-dir "$raw/memory" \
    --timeline-dir "$out/memory/timelines" --keep-raw false \
    --checkpoint-contexts 2048 --checkpoint-modes forward,train_step --checkpoint best \
    --skip-factor 1.5 --nsys-contexts 2048 --nsys="${NSYS:-}" --nsys-timeout 120 \
    --out "$out/memory/2.7B.csv" --allocations-out "$out/memory/2.7B.allocations.csv" \
    --blocks-out "$out/memory/2.7B.blocks.csv" > "$out/memory.log" 2>&1
  echo "memory: exit $? in $(( $(date +%s) - t0 )) s"
  cp "$raw"/memory/*cuda_memory*.nsys-rep "$out/memory/" 2>/dev/null
fi
if [[ " $stages " == *" profile "* ]]; then
  for size in small 2.7B; do
    t0=$(date +%s)
    timeout ${PROFILE_S:-270} python3 -m cs336_systems.stages.profile run $common --size $size \
      --contexts probe --probe-start 256 --probe-max 16384 --probe-mode forward_backward \
      --grid-above 128 --grid-count 3 --modes forward,forward_backward,train_step \
      --precision fp32 --batch-size 4 --warmup 1 --steps 1 --profiler auto --nsys="${NSYS:-}" \
      --timeout 240 --raw-dir "$raw/profile" --keep-raw false --probe-out "$out/profile/$size.probe.csv" \
      --out "$out/profile/$size.csv" --kernels-out "$out/profile/$size.kernels.csv" \
      > "$out/profile_$size.log" 2>&1
    echo "profile $size: exit $? in $(( $(date +%s) - t0 )) s"
  done
fi
python3 - "$out" <<'PY'
import sys, glob, pandas as pd
pd.set_option("display.width", 200)
out = sys.argv[1]
def show(pattern, cols, query=None):
    for f in sorted(glob.glob(f"{out}/{pattern}")):
        df = pd.read_csv(f)
        if query:
            df = df.query(query)
        print(f"-- {f.removeprefix(out + '/')}")
        print(df[[c for c in cols if c in df]].to_string(index=False))
show("memory/*[0-9B].csv", ["context_length", "mode", "precision", "checkpoint", "status",
     "peak_allocated_mb", "saved_activations_mb", "analytic_checkpoint_peak_mb", "analytic_need_gib"])
show("memory/*.blocks.csv", ["context_length", "precision", "part", "rank", "op", "bytes", "share",
     "analytic_bytes", "input_bytes", "grad_bytes", "block_params", "status"])
show("profile/*.probe.csv", ["size", "context_length", "status", "peak_allocated_mb", "grid_contexts"])
show("profile/*[lB].csv", ["size", "context_length", "mode", "status", "profiler", "step_ms_mean"])
PY
