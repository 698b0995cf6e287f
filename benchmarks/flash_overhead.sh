#!/usr/bin/env bash
# The fixed host cost of our FlashAttention (the fixed-cost item), one device call, <= 6 minutes on
# one H100 from empty caches (tests <= 110 + 40 s, sweeps <= 2 x 70 s, probe <= 70 s). Writes
# under $OUT:
#  - gpu_programs.txt: tests/unit/kernels/test_flash_programs.py -m gpu, in one process (no xdist, no
#    pytest-benchmark): kept programs' bound replays == the plain path, every replayed launch bound;
#  - gpu_tests.txt: then a sample of the flash GPU tests (bf16 causal d 64/128);
#  - short_fast.csv, short_plain.csv: the short-sequence points (the flash stage's target job) (d 16,32,64,128 x n 1024,4096,16384;
#    ours vs sdpa_cudnn vs sdpa_flash, bf16 causal B1 H16), fast path on (CS336_FLASH_PROGRAMS=1)
#    and off (=0: a plan, allocations and JIT launches every call, as before);
#  - probe.csv: per point the host time of one forward+backward call (no sync), the back-to-back
#    time per call, launches per call (jit / bound / unbound), with the fast path on: the host time
#    of the forward and backward launchers alone, of the autograd forward alone, and of SDPA
#    cuDNN's forward+backward; profile_d*_n1024.txt: cProfile of 30 fast calls per head dim.
#   bash benchmarks/flash_overhead.sh   (on a GPU host, from the project root)
# Look for: gpu_programs all passed; probe bound_per_call = launches, jit/unbound_per_call 0 with
# the fast path; host_ms (fast) near host_cudnn_ms; in the summary, flash_triton fwd_bwd <=
# sdpa_cudnn at n >= 4096 and <= 1.5x at n = 1024 with the fast path on; the profiles' top
# entries name what is left of the host time.
set -uo pipefail
source scripts/gpu/env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.txt"
common="--machine h100-80gb-hbm3 --preset gpu"
t0=$(date +%s)
timeout ${PROGRAMS_S:-110} python3 -m pytest -q -m gpu -p no:cacheprovider -p no:benchmark \
  -p no:xdist tests/unit/kernels/test_flash_programs.py > "$out/gpu_programs.txt" 2>&1
echo "gpu programs tests: exit $? in $(( $(date +%s) - t0 )) s; $(tail -1 "$out/gpu_programs.txt")"
t0=$(date +%s)
timeout ${TESTS_S:-40} python3 -m pytest -q -m gpu -p no:cacheprovider -p no:benchmark \
  -p no:xdist tests/unit/kernels/test_flash_attention.py \
  -k "${TESTS_K:-bf16 and causal and (64 or 128) and not 4096}" > "$out/gpu_tests.txt" 2>&1
echo "gpu tests (sample): exit $? in $(( $(date +%s) - t0 )) s; $(tail -1 "$out/gpu_tests.txt")"
# the short-sequence points: the flash stage's target job on the gpu preset's target block, with
# SDPA flash beside ours and cuDNN and do_bench windows of 25/100 ms
block=$(python3 - <<'PY'
import yaml
from cs336_systems.planning.knobs import block_text
from cs336_systems.stages.flash.plan import TARGET_KNOBS
b = yaml.safe_load(open("config/stages/flash.yaml"))["flash"]["gpu"]
b["target"] = {**b["target"], "impls": ["flash_triton", "sdpa_cudnn", "sdpa_flash"],
               "warmup_ms": 25, "rep_ms": 100}
print(block_text(TARGET_KNOBS.select(b)))
PY
)
for mode in fast plain; do
  t0=$(date +%s)
  [ "$mode" = fast ] && on=1 || on=0
  CS336_FLASH_PROGRAMS=$on CS336_FLASH_BIND=$on timeout ${SWEEP_S:-70} \
    python3 -m cs336_systems.stages.flash target $common --out "$out/short_$mode.csv" \
    --partial "$out/partial_$mode" --block "$block" > "$out/short_$mode.log" 2>&1
  echo "target points ($mode path): exit $? in $(( $(date +%s) - t0 )) s"
done
t0=$(date +%s)
timeout ${PROBE_S:-70} python3 benchmarks/flash_overhead.py "$out/probe.csv" "$out" > "$out/probe.log" 2>&1
echo "host probe: exit $? in $(( $(date +%s) - t0 )) s"
python3 - "$out" <<'PY'
import sys, pandas as pd
out = sys.argv[1]
frames = []
for mode in ("fast", "plain"):
    try:
        df = pd.read_csv(f"{out}/short_{mode}.csv")
    except Exception as e:
        print(mode, "sweep unreadable:", e); continue
    df = df[df["status"] == "ok"] if "status" in df else df
    df["impl"] = df["impl"].where(df["impl"] != "flash_triton", f"ours_{mode}")
    frames.append(df[~df["impl"].str.startswith("sdpa")] if mode == "plain" else df)
if frames:
    df = pd.concat(frames)
    d = "d_head" if "d_head" in df else "head_dim"
    t = df.pivot_table(index=[d, "seq_len"], columns="impl", values="fwd_bwd_ms_median")
    if "ours_fast" in t and "sdpa_cudnn" in t:
        t["fast/cudnn"] = t["ours_fast"] / t["sdpa_cudnn"]
    print("forward+backward ms (median), bf16 causal B1 H16:")
    print(t.round(3).to_string())
try:
    p = pd.read_csv(f"{out}/probe.csv")
    print("host probe (ms per forward+backward call; host: issue time, no sync):")
    print(p.to_string(index=False))
except Exception as e:
    print("probe unreadable:", e)
PY
