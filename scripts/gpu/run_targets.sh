#!/usr/bin/env bash
# Continue a reference run on a GPU host: build the given Snakemake targets in the order given
# (the most wanted first) under one wall deadline, then pack results/ and report/ under $OUT.
# Finished outputs carried back are not rerun: the rerun trigger is the input set only (the
# device's copy of the tree has new mtimes and no .snakemake records).
#   CS336_GIT_COMMIT=<sha> DEADLINE_S=540 bash scripts/gpu/run_targets.sh [--config k=v ...] -- target ...
set -uo pipefail
source scripts/gpu/env.sh
: "${CS336_GIT_COMMIT:?export CS336_GIT_COMMIT=<the commit of this tree>}"
export CS336_GIT_COMMIT
out=${OUT:-/tmp/out}; mkdir -p "$out"
extra=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do extra+=("$1"); shift; done
shift || true
end=$(( $(date +%s) + ${DEADLINE_S:-540} ))
for target in "$@"; do
  left=$(( end - $(date +%s) ))
  if [ "$left" -le 15 ]; then echo "not started (deadline): $target"; continue; fi
  t0=$(date +%s)
  timeout --signal=INT --kill-after=20 "$left" snakemake --cores 1 --rerun-triggers=input \
    "$target" "${extra[@]}" >> "$out/snakemake.log" 2>&1
  echo "exit $? after $(( $(date +%s) - t0 )) s: $target"
done
tar -czf "$out/run.tgz" --exclude "results/*/.cache" results report/h100-80gb-hbm3 2>/dev/null
echo "packed $(du -h "$out/run.tgz" | cut -f1)"
