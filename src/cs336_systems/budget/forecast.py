"""The run's estimate at its start: each job the workflow is about to run, estimated by the
preset's budget model, written for planning/eta.py's progress lines, and one line on the terminal.

    python -m cs336_systems.budget.forecast --jobs jobs.json --out results/M/eta.json \
        --preset cpu --parallel 2 --config config.json

`jobs.json` is what the workflow's onstart handler lists: [{"rule", "wildcards", "outputs"}];
`config.json` the run's checked config. Each stage's plan names its measuring rules' jobs
(`ETA_KEYS`); a job of another rule (an aggregate, a plot, the report) costs LOCAL_JOB_S.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cs336_systems.budget import DEVICES, LOCAL_JOB_S, plan, stage_plan, stages_of
from cs336_systems.planning import eta
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


def estimates(config: dict, preset: str, jobs: list[dict]) -> list[dict]:
    """[{"name", "outputs", "seconds", "unestimated"}] of the workflow's jobs from the budget's
    plan. A rule no stage names in its `ETA_KEYS` (an aggregate, a plot, the report) costs
    LOCAL_JOB_S; a measuring job whose name has no estimate is `unestimated` (a test checks
    there is none)."""
    dev = DEVICES.get(preset, DEVICES["gpu"])
    budget = {(job.stage, job.job): job.seconds for job in plan(config, preset, dev)}
    keys = eta_keys(config)
    out = []
    for job in jobs:
        rule, wc = job["rule"], job["wildcards"]
        seconds = None
        if rule in keys:
            stage, name = keys[rule]
            names = name(wc)
            names = (names,) if isinstance(names, str) else names
            seconds = next((budget[(stage, n)] for n in names if (stage, n) in budget), None)
        out.append(
            {
                "name": " ".join([rule, *(str(v) for v in wc.values())]),
                "outputs": job["outputs"],
                "seconds": round(LOCAL_JOB_S if seconds is None else seconds, 1),
                "unestimated": rule in keys and seconds is None,
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
