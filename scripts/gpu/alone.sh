#!/usr/bin/env bash
# The same jobs each run alone: the distributed stages (allreduce, ddp, fsdp) and the benchmark's
# bf16 points, one measuring job at a time (`--resources gpu_jobs=1`), under their own machine
# tag, then each timing set against the run whose jobs shared the host.
#
#   BESIDE=h200-x4 bash scripts/gpu/alone.sh        # from the project root, after that run
#
# Writes results/<BESIDE>-alone/ (ALONE names another tag) and the table between the
# side-by-side markers of docs/measured-runs.md (reporting/side_by_side.py). The run's own
# ceilings job runs first here too (the benchmark's cost guard reads its rates). Knobs: CORES
# (default 4: the cards' jobs still get their own cores, planning/cores.py), STAGES, BENCHMARK
# (more benchmark knobs; default: the eager plain model only, its compiled xl and engine rows
# cost minutes alone: BENCHMARK= runs them too).
set -euo pipefail
: "${BESIDE:?the machine tag of the run whose jobs ran side by side, e.g. h200-x4}"
alone=${ALONE:-$BESIDE-alone}
stages=${STAGES:-ceilings,allreduce,ddp,fsdp,benchmark}
snakemake --cores "${CORES:-4}" --resources gpu_jobs=1 \
  --config preset=gpu "machine=$alone" "stages=[$stages]" \
  "benchmark={gpu: {precisions: [bf16]${BENCHMARK-, compile: [eager], engines: [plain]}}}" \
  -- allreduce_aggregate ddp_aggregate fsdp_aggregate benchmark_aggregate
python3 -m cs336_systems.reporting.side_by_side "results/$BESIDE" "results/$alone" \
  --out docs/measured-runs.md
