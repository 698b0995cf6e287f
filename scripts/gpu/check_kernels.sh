#!/usr/bin/env bash
# One device call: the kernels' GPU tests (in parallel processes), the flash leaderboard point and a
# short-sequence sweep of our FA2 against SDPA, the ceilings. Writes everything under $OUT.
#   bash scripts/gpu/check_kernels.sh   (on a GPU host, from the project root, with .whl/.libdw carried)
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.txt"
common="--machine h100-80gb-hbm3 --preset gpu"
t0=$(date +%s)
timeout ${TESTS_S:-300} python3 -m pytest -q -m gpu -n ${WORKERS:-8} -p no:cacheprovider \
  tests/test_flash_attention.py tests/test_flash_dispatch.py > "$out/gpu_tests.txt" 2>&1
echo "gpu tests: exit $? in $(( $(date +%s) - t0 )) s; $(tail -1 "$out/gpu_tests.txt")"
python3 -m cs336_systems.stages.flash leaderboard $common --out "$out/leaderboard.csv" \
  --impls flash_triton,sdpa_flash,sdpa_cudnn --dtype bf16 --batch-size 1 --heads 16 --seq-len 16384 \
  --head-dim 64 --warmup-ms 500 --rep-ms 2000 > "$out/leaderboard.log" 2>&1
echo "leaderboard: exit $?"
python3 -m cs336_systems.stages.flash sweep $common --out "$out/short.csv" \
  --impls flash_triton,sdpa_cudnn,sdpa_flash --dtype bf16 --batch-size 1 --heads 16 \
  --head-dims 16,32,64,128 --seq-lens 1024,4096 --warmup-ms 25 --rep-ms 100 > "$out/short.log" 2>&1
echo "short sweep: exit $?"
python3 -m cs336_systems.stages.ceilings $common --out "$out/ceilings.csv" ${CEILINGS_ARGS:-} \
  > "$out/ceilings.log" 2>&1
echo "ceilings: exit $?"
python3 - "$out" <<'PY'
import sys, pandas as pd
out = sys.argv[1]
for name in ("leaderboard", "short"):
    try:
        df = pd.read_csv(f"{out}/{name}.csv")
    except Exception as e:
        print(name, "unreadable:", e); continue
    cols = [c for c in ("impl", "head_dim", "seq_len", "status", "fwd_ms_median", "bwd_ms_median", "fwd_bwd_ms_median") if c in df]
    print(df[cols].to_string(index=False))
PY
