"""The run's estimate at its start: each job the workflow is about to run, estimated by the
preset's budget model, written for planning/eta.py's progress lines, and one line on the terminal.

    python -m cs336_systems.budget.forecast --jobs jobs.json --out results/M/eta.json \
        --preset cpu --parallel 2 --config config.json

`jobs.json` is what the workflow's onstart handler lists: [{"rule", "wildcards", "outputs"}];
`config.json` the run's checked config. A job the budget has no row for (an aggregate, a plot,
the report) costs LOCAL_JOB_S.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cs336_systems.budget import DEVICES, LOCAL_JOB_S, plan
from cs336_systems.planning import eta
from cs336_systems.planning.log import configure, get_logger

log = get_logger(__name__)

# rule -> the budget's (stage, job name) for a job of it (budget/__init__.py names its jobs)
KEYS = {
    "benchmark": lambda w: ("benchmark", f"{w['size']} ctx{w['ctx']} {w['attention']}"),
    "benchmark_warmup": lambda w: ("benchmark", f"warm-up sweep {w['size']}"),
    "memory": lambda w: ("memory", w["size"]),
    "profile": lambda w: ("profile", w["size"]),
    "attention": lambda w: ("attention", w["impl"]),
    "flash": lambda w: ("flash", w["dtype"]),
    "flash_target": lambda w: ("flash", "target"),
    "flash_leaderboard": lambda w: ("flash", "leaderboard"),
    "checkpointing_accounting": lambda w: ("checkpointing", "accounting"),
    "checkpointing": lambda w: ("checkpointing", w["precision"]),
    "allreduce": lambda w: ("allreduce", w["backend"]),
    "ddp": lambda w: ("ddp", w["kind"]),
    "fsdp": lambda w: ("fsdp", "runs"),
    "leaderboard_ablation": lambda w: ("leaderboard", "ablation"),
    "kernel_tests": lambda w: ("kernel_tests", "kernel_tests"),
    "ceilings": lambda w: ("ceilings", "ceilings"),
    "precision": lambda w: ("precision", "precision"),
    "arithmetic": lambda w: ("arithmetic", "arithmetic"),
}


def estimates(config: dict, preset: str, jobs: list[dict]) -> list[dict]:
    """[{"name", "outputs", "seconds"}] of the workflow's jobs from the budget's plan."""
    dev = DEVICES.get(preset, DEVICES["gpu"])
    budget: dict[tuple[str, str], float] = {}
    for job in plan(config, preset, dev):
        budget[(job.stage, job.job)] = job.seconds
    out = []
    for job in jobs:
        rule, wc = job["rule"], job["wildcards"]
        seconds = None
        if rule in KEYS:
            key = KEYS[rule](wc)
            # the leaderboard's one job is `runs`, or `reduced` where the world does not fit
            seconds = budget.get(key, budget.get((key[0], "reduced")))
        name = " ".join([rule, *(str(v) for v in wc.values())])
        out.append(
            {
                "name": name,
                "outputs": job["outputs"],
                "seconds": round(LOCAL_JOB_S if seconds is None else seconds, 1),
                # a measuring job the budget has no row for (a test checks there is none)
                "unestimated": rule in KEYS and seconds is None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", required=True, type=Path)
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--parallel", type=int, default=1, help="jobs that run at once")
    ap.add_argument("--start", type=float, default=None, help="the run's start (epoch s)")
    args = ap.parse_args(argv)
    configure("eta")
    jobs = json.loads(args.jobs.read_text())
    est = estimates(json.loads(args.config.read_text()), args.preset, jobs)
    start = args.start if args.start is not None else time.time()
    eta.write(args.out, est, args.parallel, start)
    plan_s = eta.plan_seconds({"jobs": est, "parallel": args.parallel})
    longest = max(est, key=lambda j: j["seconds"], default={"name": "-", "seconds": 0.0})
    log.info(
        "%d jobs to run, estimated %s with %d at once (the %s preset's budget model, "
        "docs/budgets.md; the longest: %s, %s); the time left follows each job",
        len(est),
        eta.minutes(plan_s),
        args.parallel,
        args.preset,
        longest["name"],
        eta.minutes(longest["seconds"]),
    )


if __name__ == "__main__":
    main()
