"""The time budget of a preset: an estimate of every job the workflow plans, from the config.

    python -m cs336_systems.budget                       # every preset: logs the verdicts
    python -m cs336_systems.budget --out docs/budgets.md  # and writes the tables

Each stage estimates its own jobs (`stages/<stage>/plan.py: estimate(knobs, cost)`, typed knobs
in, seconds out); this package holds the model of the machine they read (`CostModel` in
model.py: a step's FLOPs at the rate a `Device` of devices.py reaches, its memory, a build, a
compile) and sums the jobs. The numbers are estimates to plan with, not measurements; the
constants are calibrated on the reference runs' job logs (report/reference/<machine>/jobs/:
measured.py, whose tables tables.py writes into docs/budgets.md). A preset whose sum is above
its budget fails `check` (tests/unit/budget/test_budget.py holds gpu to 25 minutes on one H100 and cpu to 5
on 2 cores). The sizes are the run's edition's (config `edition`).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path

from cs336_systems.budget.devices import CPU2, H100, Device
from cs336_systems.budget.model import CostModel
from cs336_systems.planning.config import load_yaml, with_stage_defaults
from cs336_systems.planning.edition import DEFAULT_EDITION, edition_overrides
from cs336_systems.planning.estimate import Job

__all__ = [
    "CPU2", "H100", "CostModel", "Device", "Job", "check", "plan", "run_config", "wall_seconds"
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[3]
STAGES_DIR = Path(__file__).resolve().parents[1] / "stages"
DEVICES = {"gpu": H100, "full": H100, "cpu": CPU2}
# the aggregate, plot and report jobs: a process each (the reference H100 run: about 30 local
# jobs in the 42 s between 21.2 min of wall time and 20.5 with a logged job running)
LOCAL_JOB_S = 1.5
# what a run spends outside its measuring jobs, which run one at a time on one card or on the
# host's cores (the `timing` resource; the aggregates and plots beside a GPU job, between the
# jobs timed on the CPU): its start, and the last stage's aggregate and plots and the report
# after the last measurement (the cpu reference of dc69578: 277 s of Snakemake, its measuring
# jobs 266 s from first start to last end; that of e32e8b7, the light jobs between the
# measuring ones: 231 s and 214 s of jobs; replayed on the four-H200 run of 5f1ec1e: 8 s before
# the first job, 12 s after the last)
OUTSIDE_S = 12.0
# the stages whose grids or problems differ between the editions: a 2025 run is these under its
# own machine tag (README, "Presets and configuration"); the others answer both editions alike
EDITION_STAGES = ("ceilings", "benchmark", "memory", "profile", "arithmetic")


def stage_plan(stage: str):
    """The stage's plan module (`stages/<stage>/plan.py`)."""
    return importlib.import_module(f"cs336_systems.stages.{stage}.plan")


def stages_of(config: dict) -> list[str]:
    """The config's stages (a block of config/stages/ each, a plan each), in the report's order."""
    names = [s for s in config if (STAGES_DIR / s / "plan.py").is_file()]
    order = {s: getattr(importlib.import_module(f"cs336_systems.stages.{s}"), "ORDER", 999)
             for s in names}  # fmt: skip
    return sorted(names, key=lambda s: (order[s], s))


def run_config(root: Path = ROOT, edition: int | None = None) -> dict:
    """The default run's config (`edition`: that edition's grids instead of config.yaml's)."""
    config = load_yaml(root / "config" / "config.yaml")
    if edition is not None:
        config["edition"] = edition
    stages = with_stage_defaults(config, root / "config" / "stages")
    problems = edition_overrides(config, stages, config.get("edition", DEFAULT_EDITION))
    if problems:
        raise ValueError(f"config/: malformed `editions`: {problems}")
    return config


def estimate(config: dict, stage: str, preset: str, cost: CostModel) -> list[Job]:
    """The stage's jobs under `preset` (its plan's `estimate` of its typed knobs)."""
    p = stage_plan(stage)
    return p.estimate(p.KNOBS.from_block(config[stage][preset]), cost)


def plan(config: dict, preset: str, dev: Device, only: tuple[str, ...] | None = None) -> list[Job]:
    """Every job the run plans (`only`: these stages' jobs, as `stages=[...]` runs them)."""
    stages = [s for s in stages_of(config) if preset in config[s] and (only is None or s in only)]
    cost = CostModel(dev, config.get("edition", DEFAULT_EDITION), tuple(stages_of(config)))
    jobs = [job for stage in stages for job in estimate(config, stage, preset, cost)]
    if dev.alone != 1.0:
        how = f"x{dev.alone:g}: one job at a time (devices.py `alone`)"
        jobs = [replace(j, seconds=j.seconds * dev.alone, how=f"{j.how}; {how}") for j in jobs]
    # the light jobs wait for a job timed on the CPU (the `quiet` resource), not for a GPU job
    where = "between" if dev.gpus == 0 else "beside"
    jobs.append(Job("(local)", "start, last plots, report", OUTSIDE_S,
                    f"the run's start and end; the other {2 * len(stages)} aggregates and plots"
                    f" run {where} the measuring jobs"))  # fmt: skip
    return jobs


def wall_seconds(jobs: list[Job]) -> float:
    """The run's wall time: its jobs one after another (the measuring jobs run one at a time on
    the budget's device; the `(local)` row is the time outside them)."""
    return sum(j.seconds for j in jobs)


def check(jobs: list[Job], dev: Device) -> str:
    """'' when the jobs fit the device's budget, else why not."""
    total = wall_seconds(jobs)
    if total <= dev.budget_s:
        return ""
    worst = sorted(jobs, key=lambda j: -j.seconds)[:3]
    return (
        f"estimated {total / 60:.1f} min, above the budget of {dev.budget_s / 60:.0f} min on "
        f"{dev.name}; the longest: "
        + "; ".join(f"{j.stage} {j.job} {j.seconds:.0f} s" for j in worst)
    )
