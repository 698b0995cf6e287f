#!/usr/bin/env bash
# One Snakemake run that outlives one device call: the reference run as a user makes it
# (`snakemake --cores 1 report --config preset=gpu`, from empty results and caches), without the
# stops, restarts and gaps of a run cut into 10-minute calls.
#
#   CS336_GIT_COMMIT=<sha> bash scripts/gpu/run_detached.sh start [--config k=v ...]
#       copies the tree to /tmp/cs336_run/tree (the device tool re-copies the working tree at
#       every call, under a running job), starts Snakemake there in its own process session
#       (setsid: it runs on after the call returns, until the machine goes back), then waits
#   bash scripts/gpu/run_detached.sh wait
#       follows the run (progress every minute) until it ends or DEADLINE_S (default 570 s) pass;
#       once it has ended, packs results/ and report/ under $OUT (run.tgz) with the job times
#
# The machine stays held between calls only if the next call comes within the kind's warm time
# (30 s on the one-GPU kinds) and starts before its 30-minute lease ends: issue each `wait` as
# soon as the last returns, and plan runs that end within about 27 minutes of the first call.
# carry: .whl (snakemake) and .libdw (nsys) in the first call; nothing after.
set -uo pipefail
state=/tmp/cs336_run
out=${OUT:-/tmp/out}
mkdir -p "$out"

progress() {
  local log=$state/snakemake.log
  local steps rule
  steps=$(grep -E "^[0-9]+ of [0-9]+ steps" "$log" 2>/dev/null | tail -1)
  rule=$(grep -E "^(rule|localrule) " "$log" 2>/dev/null | tail -1)
  echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - $(cat "$state/started") )) s: ${steps:-0 steps done} (last started: ${rule:-none})"
}

case "${1:-}" in
  start)
    shift
    : "${CS336_GIT_COMMIT:?export CS336_GIT_COMMIT=<the commit of this tree>}"
    if [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null; then
      echo "a run is already in progress here (pid $(cat "$state/pid")): run 'wait'"; exit 2
    fi
    rm -rf "$state"; mkdir -p "$state"
    cp -a . "$state/tree"
    cd "$state/tree" || exit 2
    source scripts/gpu/env.sh
    export CS336_GIT_COMMIT
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader \
      | tee "$state/gpu.txt"
    date +%s > "$state/started"
    printf '%q ' snakemake --cores 1 report "$@" > "$state/command"
    echo "started: $(cat "$state/command")(commit $CS336_GIT_COMMIT)"
    setsid bash -c 'echo $$ > "$0/pid"; cd "$0/tree" && snakemake --cores 1 report "${@}" \
      > "$0/snakemake.log" 2>&1; echo $? > "$0/rc"' "$state" "$@" < /dev/null > /dev/null 2>&1 &
    sleep 5
    exec bash "$state/tree/scripts/gpu/run_detached.sh" wait
    ;;
  wait)
    if [ ! -f "$state/started" ]; then
      echo "no run on this machine: the machine that held it was given back (a call came later" \
        "than the warm time, or the lease ended); start again"
      exit 3
    fi
    end=$(( $(date +%s) + ${DEADLINE_S:-570} ))
    last=0
    while [ ! -f "$state/rc" ]; do
      if ! kill -0 "$(cat "$state/pid" 2>/dev/null || echo 0)" 2>/dev/null; then
        echo "the run stopped without an exit status (killed?)"; break
      fi
      now=$(date +%s)
      [ "$now" -ge "$end" ] && break
      if [ $(( now - last )) -ge 60 ]; then progress; last=$now; fi
      sleep 5
    done
    progress
    cp "$state/snakemake.log" "$out/"
    if [ ! -f "$state/rc" ]; then
      echo "still running: call 'wait' again now"; exit 0
    fi
    echo "snakemake exit $(cat "$state/rc") after $(( $(date +%s) - $(cat "$state/started") )) s"
    grep -E "^(Error|MissingOutput)|failed" "$state/snakemake.log" | head -5
    cd "$state/tree" || exit 2
    machine=$(ls -t results | head -1)
    python3 scripts/gpu/job_times.py "results/$machine/jobs" 10
    tar -czf "$out/run.tgz" --exclude "results/*/.cache" results "report/$machine"
    if [ "$(stat -c %s "$out/run.tgz")" -gt $(( 15 * 1024 * 1024 )) ]; then
      # the device returns files of at most 16 MiB: the raw captures (nsys reports, memory
      # snapshots) stay behind
      tar -czf "$out/run.tgz" --exclude "results/*/.cache" --exclude "results/*/*/raw" results \
        "report/$machine"
      echo "raw captures left out (over 15 MiB with them)"
    fi
    echo "packed run.tgz: $(du -h "$out/run.tgz" | cut -f1)"
    ;;
  *)
    echo "usage: run_detached.sh start [--config k=v ...] | wait"; exit 2
    ;;
esac
