#!/usr/bin/env bash
# The plan of a run on a host of N GPUs, from the config alone, on any machine: a dry run of the
# workflow over a faked pool of N H200s (an `nvidia-smi` of this script's own, first on PATH),
# each job estimated by the preset's budget model and placed on the cards by its priority.
#
#   bash scripts/plan.sh 4                                # the gpu preset on 4 cards
#   PRESET=gpu GPU_NAME="NVIDIA H100 80GB HBM3" GPU_MIB=81559 bash scripts/plan.sh 2 'stages=[ddp,fsdp]'
#
# Extra arguments are --config values. Prints each card's jobs over time, the estimated wall
# time and the GPU-seconds per rule; writes nothing under results/ (its machine tag's folder
# is removed).
set -euo pipefail
cards=${1:?the number of GPUs}
shift
preset=${PRESET:-gpu}
tag="plan-x$cards"
fake=$(mktemp -d)
trap 'rm -rf "$fake" "results/$tag"' EXIT
cat >"$fake/nvidia-smi" <<EOS
#!/bin/sh
for i in \$(seq 0 $((cards - 1))); do
  case "\$*" in
    *driver_version*) echo 580.65 ;;
    *) echo "${GPU_NAME:-NVIDIA H200}, ${GPU_MIB:-143771}, GPU-plan-\$i" ;;
  esac
done
EOS
chmod +x "$fake/nvidia-smi"
PATH="$fake:$PATH" CS336_GPU_CHECK=off env -u CUDA_VISIBLE_DEVICES snakemake -n --cores "$cards" \
  --resources "gpu_jobs=$cards" --config "preset=$preset" "machine=$tag" "$@" -- report \
  >"$fake/dry.txt"
edition=()  # the estimates read the edition's grids, as the run's own ETA does
for arg in "$@"; do [[ $arg == edition=* ]] && edition=(--edition "${arg#edition=}"); done
python3 -m cs336_systems.budget.forecast --dry-run "$fake/dry.txt" --preset "$preset" \
  --cards "$cards" --parallel "$cards" --memory-gib "$(( ${GPU_MIB:-143771} / 1024 ))" "${edition[@]}"
