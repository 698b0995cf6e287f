#!/usr/bin/env bash
# One device call (2 GPUs: nvidia-h200-x2; budget about 4 min wall, every step under `timeout`):
# the ceilings stage, the NCCL all-reduce on 2 ranks, then the arithmetic stage and its report
# section through Snakemake, gpu preset. Writes everything under $OUT; prints the stage's
# headline numbers and the ring model check.
#   bash scripts/gpu/arithmetic.sh   (on a GPU host, from the project root, with .whl carried)
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$out/gpu.txt"
machine=${MACHINE_TAG:-h200-x2}
t0=$(date +%s)
cat > "$out/arithmetic_run.yaml" <<YAML
preset: gpu
machine: $machine
stages: [ceilings, allreduce, arithmetic]
allreduce:
  gpu: {backends: [nccl], world_sizes: [2], nccl_buffers: [default]}
YAML
timeout ${RUN_S:-420} snakemake --cores 1 report --configfile "$out/arithmetic_run.yaml" \
  > "$out/snakemake.txt" 2>&1
echo "snakemake: exit $? in $(( $(date +%s) - t0 )) s"
cp -r "results/$machine" "$out/results" 2>/dev/null
cp "report/$machine/report.md" "$out/report.md" 2>/dev/null
python3 - "$out/results/arithmetic.csv" <<'PY'
import sys, pandas as pd
df = pd.read_csv(sys.argv[1])
print(df["status"].value_counts().to_string())
keep = df["quantity"].isin(["max_devices", "forward_max_devices", "backward_max_devices",
                            "serial_max_devices"]) & (df["devices"].fillna(2) <= 2)
print(df[keep][["case", "shape", "problem", "quantity", "value", "C_tflops", "W_gbps"]]
      .drop_duplicates(["case", "shape", "problem", "quantity"]).to_string(index=False))
ring = df[df["problem"] == "ring_check"]
print(ring[["case", "devices", "message_mb", "predicted_ms", "measured_ms", "value"]].to_string(index=False))
PY
