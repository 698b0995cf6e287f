#!/usr/bin/env bash
# One device call (budget: about 8 min on one H100 80GB): the 2026 edition's benchmark at context
# 512, every size (small, medium, large, xl, 10B), train step (fp32, bf16), eager naive attention,
# with the per-phase columns (fwd/bwd/opt) and the memory model's skip before allocating.
# Checks: fwd+bwd+opt medians within ~10% of the step median for every size that ran; 10B rows
# are `skipped: ... needs N MiB; M MiB free on cuda` (train step ~205 GB of state), never a crash;
# an `oom` status, if any, is a row too. Then the benchmarking section rendered from these rows.
#   bash scripts/gpu/edition_benchmark.sh   (on a GPU host, from the project root)
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out/results/h100"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
common="--machine h100-80gb-hbm3 --preset gpu --edition 2026"
t0=$(date +%s)
for size in small medium large xl 10B; do
  timeout ${POINT_S:-150} python3 -m cs336_systems.stages.benchmark run $common --size $size \
    --context-length 512 --modes train_step --precisions fp32,bf16 --compile eager \
    --attention naive --warmup 3 --steps 5 --out "$out/points_$size.csv" > "$out/$size.log" 2>&1
  echo "$size: exit $? at $(( $(date +%s) - t0 )) s"
done
python3 - "$out" <<'PY'
import glob, sys
import pandas as pd
from cs336_systems.core.results import write_csv
from cs336_systems import report
out = sys.argv[1]
df = pd.concat([pd.read_csv(p) for p in sorted(glob.glob(f"{out}/points_*.csv"))], ignore_index=True)
write_csv(df, f"{out}/results/h100/benchmark.csv")
cols = ["edition", "size", "params", "precision", "status", "fwd_ms_median", "bwd_ms_median",
        "opt_ms_median", "step_ms_median", "peak_memory_mb"]
print(df[[c for c in cols if c in df]].to_string(index=False))
ok = df[df["status"] == "ok"]
if len(ok):
    parts = (ok.fwd_ms_median + ok.bwd_ms_median + ok.opt_ms_median) / ok.step_ms_median
    print("phases/step per ok row:", [round(x, 3) for x in parts])
text = report.render(f"{out}/results/h100", ["benchmark"])
open(f"{out}/report.md", "w").write(text)
sec = text.split("#### Forward, backward", 1)
print("#### Forward, backward" + sec[1].split("### Q2", 1)[0] if len(sec) > 1 else "no phase section")
PY
