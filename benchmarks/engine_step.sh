#!/usr/bin/env bash
# One device call (budget: 6 min on one H100: tests 60 s, timings 300 s, each bounded by its
# timeout): the fused AdamW kernel's tests on CUDA (tests/unit/engine/test_master_adamw.py, every test on the
# GPU) and the engine's GPU-marked tests (master weights against the engine without them and
# against the plain model), then benchmarks/engine_step.py: the 2026 xl and small at context 512
# batch 4 bf16, plain compiled step vs engine (compiled blocks) without and with bf16 working
# weights + fp32 masters, synchronized steps with per-phase ms (CUDA events), MFU against the
# bf16 matmul peak the script measures first (ceilings stage) for each variant's matmul path.
# Writes everything under $OUT (engine_step.csv, ceilings.csv, the logs).
#   bash benchmarks/engine_step.sh   (on a GPU host, from the project root)
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader | tee "$out/gpu.txt"
t0=$(date +%s)
timeout ${TESTS_S:-60} python3 -m pytest -q -p no:cacheprovider tests/unit/engine/test_master_adamw.py \
  "tests/unit/engine/test_engine.py::test_gpu_master_weights_match_the_engine_without_them_and_the_plain_model" \
  "tests/unit/engine/test_engine.py::test_gpu_bf16_reduced_config_matches_the_plain_model" \
  > "$out/gpu_tests.txt" 2>&1
echo "master-weight gpu tests: exit $? in $(( $(date +%s) - t0 )) s; $(tail -1 "$out/gpu_tests.txt")"
grep -E "^(FAILED|ERROR)" "$out/gpu_tests.txt" | head -5
t0=$(date +%s)
timeout ${STEP_S:-300} python3 benchmarks/engine_step.py "$out" --sizes xl,small \
  --variants engine_mw,engine,plain --timers marks --budget-s ${BUDGET_S:-270} \
  > "$out/engine_step.log" 2>&1
echo "engine step timings: exit $? in $(( $(date +%s) - t0 )) s"
grep -E "bf16 peak| sync |skipped|oom|error|wall" "$out/engine_step.log" | tail -8
