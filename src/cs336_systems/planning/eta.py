"""The estimated time a run has left, one line as each job finishes.

    2026-11-26 06:27:58 eta INFO  12 of 45 jobs done in 1.3 min; about 2.1 min left (the budget's estimate, x1.2 as this run goes)

When a run starts, the workflow's onstart handler lists the jobs it will run and
`python -m cs336_systems.budget.forecast` estimates each (the preset's time budget model, budget/)
into `results/<machine>/eta.json`: the run's start, how many jobs run at once, and per job its
outputs and estimated seconds. After each job's command the rules' shell suffix runs
`python -m cs336_systems.planning.eta`, which counts the jobs whose outputs were written since the
start and prints what is left: the estimates of the jobs not done, over the jobs that run at once,
scaled by how this run's finished jobs compare with their estimates (a loaded machine runs
slower than the budget's). Nothing is printed without the file ($CS336_ETA names it). Standard
library only: it runs after every job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cs336_systems.planning import schedule
from cs336_systems.planning.log import configure, get_logger

log = get_logger(__name__)

ENV = "CS336_ETA"
# the scale observed so far is trusted within these bounds (one slow first job says little)
SCALE_BOUNDS = (0.5, 3.0)


def write(
    path: str | os.PathLike, jobs: list[dict], parallel: int, start: float, cards: int = 0
) -> None:
    """`jobs`: [{"name", "outputs", "seconds", "gpus", "alone", "priority"}]; `parallel` jobs at
    once on a host of `cards` GPUs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    plan = {"start": start, "parallel": parallel, "cards": cards, "jobs": jobs}
    tmp.write_text(json.dumps(plan))
    os.replace(tmp, path)


def done(job: dict, since: float) -> bool:
    """Every output of `job` written since `since` (a second of slack for coarse clocks)."""
    try:
        return all(Path(p).stat().st_mtime >= since - 1.0 for p in job["outputs"])
    except OSError:
        return False


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def progress(plan: dict, now: float) -> str:
    """The line: jobs done, time so far, and the estimate of what is left."""
    jobs, start = plan["jobs"], plan["start"]
    parallel = max(1, int(plan.get("parallel", 1)))
    finished = [j for j in jobs if done(j, start)]
    left = [j for j in jobs if j not in finished]
    elapsed = now - start
    head = f"{len(finished)} of {len(jobs)} jobs done in {minutes(elapsed)}"
    if not left:
        return f"{head}; the run's estimate was {minutes(plan_seconds(plan))}"
    cards = int(plan.get("cards", 0))
    est_done = schedule.wall_seconds(finished, cards, parallel)
    scale = 1.0
    if est_done > 0 and elapsed > 0:
        lo, hi = SCALE_BOUNDS
        scale = min(hi, max(lo, elapsed / est_done))
    rest = scale * schedule.wall_seconds(left, cards, parallel)
    how = "the budget's estimate" + (f", x{scale:.1f} as this run goes" if scale != 1.0 else "")
    return f"{head}; about {minutes(rest)} left ({how})"


def plan_seconds(plan: dict) -> float:
    """The run's estimated wall time: its jobs placed on the host's cards and slots."""
    cards, parallel = int(plan.get("cards", 0)), max(1, int(plan.get("parallel", 1)))
    return schedule.wall_seconds(plan["jobs"], cards, parallel)


def main() -> None:
    path = os.environ.get(ENV)
    if not path or not Path(path).is_file():
        return
    try:
        plan = json.loads(Path(path).read_text())
        line = progress(plan, time.time())
    except (OSError, ValueError, KeyError, TypeError):
        return  # a progress line is never worth failing a job for
    configure("eta")
    log.info("%s", line)


if __name__ == "__main__":
    main()
