"""The run's estimate at its start: each job the workflow is about to run, estimated by the
preset's budget model, written for planning/eta.py's progress lines, and one line on the terminal.

    python -m cs336_systems.budget.forecast --jobs jobs.json --out results/M/eta.json \
        --preset cpu --parallel 2 --config config.json

`jobs.json` is what the workflow's onstart handler lists: [{"rule", "wildcards", "outputs"}];
`config.json` the run's checked config.

    snakemake -n --cores 4 --resources gpu_jobs=4 --config preset=gpu -- report > dry.txt
    python -m cs336_systems.budget.forecast --dry-run dry.txt --preset gpu --cards 4

prints the plan of a run not started: the jobs read from a dry run's job headers (rule,
wildcards, input, output, priority, resources), as `scripts/plan.sh` does on a host of any
number of cards (a faked GPU pool). Each stage's plan names its measuring rules' jobs
(`ETA_KEYS`); a job of another rule (an aggregate, a plot, the report) costs LOCAL_JOB_S.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from functools import cache
from pathlib import Path

from cs336_systems.budget import (
    DEVICES,
    LOCAL_JOB_S,
    Device,
    plan,
    run_config,
    stage_plan,
    stages_of,
)
from cs336_systems.planning import eta, schedule
from cs336_systems.planning.log import configure, get_logger

log = get_logger(__name__)


def eta_keys(config: dict) -> dict:
    """{rule: (stage, its jobs' name from their wildcards)} of every stage's measuring rules
    (each plan's `ETA_KEYS`, planning/estimate.py)."""
    return {
        rule: (stage, name)
        for stage in stages_of(config)
        for rule, name in getattr(stage_plan(stage), "ETA_KEYS", {}).items()
    }


def device(preset: str, gpus: int | None = None, memory_gib: float | None = None) -> Device:
    """The preset's budget device on a host of `gpus` GPUs (the distributed stages run the
    world sizes it holds; None or 0: the device's own count) of `memory_gib` each (the host's
    cards: a point the budget's own card cannot hold runs on a larger one, the 10B's forward on
    a 141 GB H200; None: the device's own)."""
    dev = DEVICES.get(preset, DEVICES["gpu"])
    if memory_gib and dev.memory_gib is not None:
        dev = replace(dev, memory_gib=memory_gib)
    if not gpus or dev.gpus == 0:  # no GPU seen (a plan made elsewhere): the device's own
        return dev
    return replace(dev, gpus=gpus)


def job_seconds(
    config: dict, preset: str, gpus: int | None = None, memory_gib: float | None = None
):
    """`seconds(rule, wildcards)`: a measuring job's estimate (None for other rules). The
    budget is read on the first call, not while the workflow is planned."""

    @cache
    def tables():
        dev = device(preset, gpus, memory_gib)
        budget = {(j.stage, j.job): j.seconds for j in plan(config, preset, dev)}
        return budget, eta_keys(config)

    def seconds(rule: str, wildcards: dict) -> float | None:
        budget, keys = tables()
        if rule not in keys:
            return None
        stage, name = keys[rule]
        names = name(wildcards)
        names = (names,) if isinstance(names, str) else names
        return next((budget[(stage, n)] for n in names if (stage, n) in budget), None)

    return seconds


# Priority tiers, highest first. A job on every card of the host starts first, while the run's
# start frees them all at once (later a wide job waits for every card to come free together,
# and Snakemake reserves none: it gives a freed card to the best job that fits). Then the jobs
# other measuring jobs wait for, then the jobs on several cards: two cards freed together by a
# wide job go to the next wide job, not to two single-card ones, so the wide jobs run as a lane
# of their own instead of last, one after another. Within a tier, the largest GPU-seconds.
ALL_CARDS_PRIORITY = 100_000_000
GATE_PRIORITY = 1_000_000
WIDE_PRIORITY = 500_000


def priority(rule: str, gpu, seconds, gates: bool = False, cards: int = 0):
    """A job's Snakemake priority: its GPU-seconds (estimated seconds x cards, at least one),
    raised by its tiers (a job on each of the host's `cards`, a job that gates measuring
    jobs, a job on several cards)."""

    def value(wildcards) -> int:
        width = gpu(wildcards)
        s = seconds(rule, dict(wildcards.items())) or LOCAL_JOB_S
        tiers = (
            GATE_PRIORITY * gates
            + WIDE_PRIORITY * (width > 1)
            + ALL_CARDS_PRIORITY * (width > 1 and width >= cards)
        )
        return int(s * max(1, width)) + tiers

    return value


def estimates(
    config: dict,
    preset: str,
    jobs: list[dict],
    gpus: int | None = None,
    memory_gib: float | None = None,
) -> list[dict]:
    """[{"name", "outputs", "seconds", "unestimated"}] of the workflow's jobs from the budget's
    plan. A rule no stage names in its `ETA_KEYS` (an aggregate, a plot, the report) costs
    LOCAL_JOB_S; a measuring job whose name has no estimate is `unestimated` (a test checks
    there is none)."""
    of = job_seconds(config, preset, gpus, memory_gib)
    keys = eta_keys(config)
    out = []
    for job in jobs:
        rule, wc = job["rule"], job["wildcards"]
        seconds = of(rule, wc)
        out.append(
            {
                "name": " ".join([rule, *(str(v) for v in wc.values())]),
                "outputs": job["outputs"],
                "seconds": round(LOCAL_JOB_S if seconds is None else seconds, 1),
                "unestimated": rule in keys and seconds is None,
                "gpus": int(job.get("gpus", 0)),
                "alone": bool(job.get("alone", False)),
                "light": bool(job.get("light", False)),
                "priority": job.get("priority", 0),
                "inputs": job.get("inputs", []),
            }
        )
    return out


def dry_run_jobs(text: str) -> list[dict]:
    """The jobs of a dry run's output (`snakemake -n`), as the onstart handler lists them."""
    jobs = []
    for block in re.split(r"\n(?=rule \w+:)", text):
        head = re.match(r"rule (\w+):", block)
        if not head or head.group(1) == "all":
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, re.M))

        def pairs(key, fields=fields):
            return dict(kv.split("=", 1) for kv in fields.get(key, "").split(", ") if "=" in kv)

        res = pairs("resources")
        jobs.append({
            "rule": head.group(1), "wildcards": pairs("wildcards"),
            "inputs": [f for f in fields.get("input", "").split(", ") if f],
            "outputs": [f for f in fields.get("output", "").split(", ") if f],
            "gpus": int(res.get("gpu", 0)), "alone": bool(int(res.get("timing", 0))),
            "light": int(res.get("quiet", 0)) == 1,
            "priority": int(fields.get("priority", 0)),
        })  # fmt: skip
    return jobs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=Path)
    ap.add_argument("--dry-run", type=Path, help="a dry run's output: print its plan")
    ap.add_argument("--config", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--parallel", type=int, default=1, help="jobs that run at once")
    ap.add_argument("--cards", type=int, default=0, help="the host's GPUs the jobs share")
    ap.add_argument("--start", type=float, default=None, help="the run's start (epoch s)")
    ap.add_argument("--memory-gib", type=float, default=None, help="each card's memory (GiB)")
    ap.add_argument("--edition", type=int, default=None, help="--dry-run: the run's edition")
    args = ap.parse_args(argv)
    configure("eta")
    if args.dry_run is not None:
        print_plan(args.dry_run, args.preset, args.cards, args.parallel, args.memory_gib,
                   args.edition)  # fmt: skip
        return
    jobs = json.loads(args.jobs.read_text())
    config = json.loads(args.config.read_text())
    est = estimates(config, args.preset, jobs, args.cards, args.memory_gib)
    start = args.start if args.start is not None else time.time()
    eta.write(args.out, est, args.parallel, start, args.cards)
    placed = schedule.place(est, args.cards, args.parallel)
    (args.out.parent / "plan.txt").write_text(schedule.plan_text(placed, args.cards) + "\n")
    plan_s = max((p.end for p in placed), default=0.0)
    longest = max(est, key=lambda j: j["seconds"], default={"name": "-", "seconds": 0.0})
    log.info(
        "%d jobs to run, estimated %s with %d at once%s (the %s preset's budget model, "
        "docs/budgets.md; the longest: %s, %s; the plan per card: %s); the time left "
        "follows each job",
        len(est),
        eta.minutes(plan_s),
        args.parallel,
        f" on {args.cards} GPUs" if args.cards else "",
        args.preset,
        longest["name"],
        eta.minutes(longest["seconds"]),
        args.out.parent / "plan.txt",
    )


def print_plan(
    dry_run: Path,
    preset: str,
    cards: int,
    parallel: int,
    memory_gib: float | None = None,
    edition: int | None = None,
) -> None:
    """The plan of the dry run's jobs under the default config of `preset` (`edition`: that
    edition's grids), with the GPU-seconds per rule."""
    config = run_config(edition=edition)
    est = estimates(config, preset, dry_run_jobs(dry_run.read_text()), cards, memory_gib)
    placed = schedule.place(est, cards, max(parallel, 1))
    per: dict[str, float] = {}
    for job in est:
        if job["gpus"]:
            stage = job["name"].split()[0]
            per[stage] = per.get(stage, 0.0) + job["seconds"] * job["gpus"]
    total = sum(per.values())
    lines = [schedule.plan_text(placed, cards), f"GPU-seconds: {total:.0f} (at least "
             f"{eta.minutes(total / max(cards, 1))} on {cards} cards)"]  # fmt: skip
    lines += [f"  {s}: {v:.0f}" for s, v in sorted(per.items(), key=lambda kv: -kv[1])]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
