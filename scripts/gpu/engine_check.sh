#!/usr/bin/env bash
# One device call (budget: 5 min on one H100: tests 35 s, xl step 140 s, ceilings 25 s,
# leaderboard 100 s, each bounded by its timeout): the engine's GPU-marked tests, the 2026 xl
# (2560/10240/32/32) context 512 batch 4 bf16 train step (scripts/gpu/engine_step.py): plain vs
# the engine with and without bf16 working weights vs a compiled HF GPT-2 peer, back to back
# (do_bench), MFU against the bf16 matmul peak of each variant's path from the ceilings CSV
# measured below, and the leaderboard stage's reduced one-GPU configuration (its world-2 run
# becomes `skipped` rows with the command).
# Writes everything under $OUT.
#   bash scripts/gpu/engine_check.sh   (on a GPU host, from the project root)
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.txt"
t0=$(date +%s)
timeout ${TESTS_S:-35} python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_fused_ce.py tests/test_engine.py > "$out/gpu_tests.txt" 2>&1
echo "engine gpu tests: exit $? in $(( $(date +%s) - t0 )) s; $(tail -1 "$out/gpu_tests.txt")"
t0=$(date +%s)
timeout ${CEIL_S:-25} python3 -m cs336_systems.stages.ceilings --machine h100-80gb-hbm3 --preset gpu \
  --out "$out/ceilings.csv" --dtypes bf16 > "$out/ceilings.log" 2>&1
echo "ceilings: exit $? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout ${STEP_S:-140} python3 scripts/gpu/engine_step.py "$out" --peak-csv "$out/ceilings.csv" \
  --timers do_bench --budget-s $(( ${STEP_S:-140} - 10 )) > "$out/engine_step.log" 2>&1
echo "xl step: exit $? in $(( $(date +%s) - t0 )) s"
grep -E "bf16 peak|target|do_bench|skipped|oom|error" "$out/engine_step.log" | tail -12
t0=$(date +%s)
timeout ${LB_S:-100} python3 -m cs336_systems.stages.leaderboard --machine h100-80gb-hbm3 \
  --preset gpu --backend nccl --world-size 2 --warmup 1 --steps 1 --compile \
  --peak-csv "$out/ceilings.csv" --timeout-s 95 --out "$out/leaderboard.csv" \
  > "$out/leaderboard.log" 2>&1
echo "leaderboard (reduced, 1 GPU): exit $? in $(( $(date +%s) - t0 )) s"
python3 - "$out" <<'PY'
import sys, pandas as pd
try:
    df = pd.read_csv(f"{sys.argv[1]}/leaderboard.csv")
except Exception as e:
    print("leaderboard unreadable:", e); raise SystemExit
cols = [c for c in ("config", "variant", "world_size", "num_layers", "status", "checkpointing",
        "step_ms_median", "tflops", "mfu", "peak_mem_gb_per_rank", "setup_s", "fits_10_min") if c in df]
print(df[cols].to_string(index=False))
PY
