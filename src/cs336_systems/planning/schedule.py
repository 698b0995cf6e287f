"""How a run's jobs fill the host: the estimated jobs placed on its cards and job slots, highest
priority first, as Snakemake's scheduler places them, so that the time a run takes is its
longest card's, not its jobs' sum over the slots.

    python -m cs336_systems.planning.schedule results/<machine>/eta/eta.json

prints the plan: each card's jobs over time (a job on several cards on each), the jobs timed on
the CPU alone, and the run's estimated wall time. `place(jobs, cards, slots)` is what the
run's first estimate and each progress line read (planning/eta.py). A job is a dict of the
forecast (budget/forecast.py): `name`, `seconds`, `gpus` (the cards it holds), `alone` (it times
on the CPU: no other measuring job beside it), `light` (an aggregate or plot on a GPU host: no
job slot, beside anything but a job timed on the CPU), `priority` and, where known, `inputs` and
`outputs`: a job starts only once the jobs writing its inputs have ended (a run's first jobs are
the ones nothing gates, so a wide job that waits for the ceilings does not start with them).
Standard library only.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(order=True)
class Placed:
    end: float
    start: float = field(compare=False)
    name: str = field(compare=False)
    cards: tuple[int, ...] = field(compare=False, default=())
    alone: bool = field(compare=False, default=False)
    light: bool = field(compare=False, default=False)


def _fits(job: dict, free: list[int], running: list[Placed], slots: int, cards: int) -> bool:
    if any(p.alone for p in running):
        return False
    if job.get("light"):
        return True
    if sum(not p.light for p in running) >= slots:
        return False
    if job.get("alone"):
        return not any(p.cards or p.alone or p.light for p in running)
    return min(int(job.get("gpus", 0)), cards) <= len(free)


def _producers(jobs: list[dict]) -> dict[str, set[str]]:
    """{job name: the names of the jobs writing one of its inputs}."""
    writer = {out: j["name"] for j in jobs for out in j.get("outputs", ())}
    return {
        j["name"]: {writer[f] for f in j.get("inputs", ()) if f in writer} - {j["name"]}
        for j in jobs
    }


def place(jobs: list[dict], cards: int, slots: int, start: float = 0.0) -> list[Placed]:
    """Every job placed: at each instant, the waiting jobs whose inputs are written and that fit
    start, highest priority first (a wide job waits for its cards; a job timed on the CPU for
    an idle host)."""
    waiting = sorted(jobs, key=lambda j: -float(j.get("priority", 0)))
    needs = _producers(jobs)
    ended: set[str] = set()
    free = list(range(cards))
    running: list[Placed] = []
    placed: list[Placed] = []
    now = start
    while waiting or running:
        for job in list(waiting):
            if needs[job["name"]] <= ended and _fits(job, free, running, max(1, slots), cards):
                width = min(int(job.get("gpus", 0)), cards)
                got, free = tuple(free[:width]), free[width:]
                p = Placed(
                    now + float(job["seconds"]),
                    now,
                    job["name"],
                    got,
                    bool(job.get("alone")),
                    bool(job.get("light")),
                )
                heapq.heappush(running, p)
                placed.append(p)
                waiting.remove(job)
        if not running:  # nothing fits an idle host (wider than it): run it on what there is
            job = next((j for j in waiting if needs[j["name"]] <= ended), waiting[0])
            waiting.remove(job)
            running.append(Placed(now + float(job["seconds"]), now, job["name"], tuple(free)))
            placed.append(running[-1])
        done = heapq.heappop(running)
        now = done.end
        ended.add(done.name)
        free = sorted([*free, *done.cards])
    return placed


def wall_seconds(jobs: list[dict], cards: int, slots: int) -> float:
    """The run's estimated wall time: its last job's end."""
    return max((p.end for p in place(jobs, cards, slots)), default=0.0)


def plan_text(placed: list[Placed], cards: int) -> str:
    """Each card's jobs over time, then the jobs with no card (CPU, local), in minutes."""
    lines = []
    for card in range(cards):
        mine = sorted((p for p in placed if card in p.cards), key=lambda p: p.start)
        busy = sum(p.end - p.start for p in mine)
        lines.append(f"GPU {card}: {len(mine)} jobs, busy {busy / 60:.1f} min")
        lines += [f"  {p.start / 60:5.1f}-{p.end / 60:5.1f} min  {p.name}" for p in mine]
    rest = sorted((p for p in placed if not p.cards), key=lambda p: p.start)
    lines.append(f"no GPU: {len(rest)} jobs")
    lines += [
        f"  {p.start / 60:5.1f}-{p.end / 60:5.1f} min  {p.name}{' (alone)' if p.alone else ''}"
        for p in rest
    ]
    end = max((p.end for p in placed), default=0.0)
    lines.append(f"estimated wall time: {end / 60:.1f} min")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eta", type=Path, help="results/<machine>/eta/eta.json of a run")
    args = ap.parse_args(argv)
    plan = json.loads(args.eta.read_text())
    cards = int(plan.get("cards", 0))
    sys.stdout.write(
        plan_text(place(plan["jobs"], cards, int(plan.get("parallel", 1))), cards) + "\n"
    )


if __name__ == "__main__":
    main()
