"""The presets' budget tables: docs/budgets.md (`python -m cs336_systems.budget --out
docs/budgets.md`), the estimates of budget/__init__.py per preset and the calibration against
the reference runs' job logs (budget/measured.py)."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from cs336_systems.budget import (
    DEVICES,
    EDITION_STAGES,
    OUTSIDE_S,
    ROOT,
    Device,
    Job,
    check,
    plan,
    run_config,
    wall_seconds,
)
from cs336_systems.budget.measured import calibration_markdown
from cs336_systems.core.results import atomic_write_text
from cs336_systems.planning.log import configure, get_logger

log = get_logger(__name__)


def markdown(preset: str, jobs: list[Job], dev: Device, what: str = "") -> str:
    total = wall_seconds(jobs)
    by_stage: dict[str, float] = {}
    for j in jobs:
        by_stage[j.stage] = by_stage.get(j.stage, 0.0) + j.seconds
    lines = [
        f"### preset `{preset}`{what} on {dev.name}: {total / 60:.1f} min estimated (the"
        f" measuring jobs one at a time, plus {OUTSIDE_S:.0f} s for the start, the last plots"
        " and the report), "
        + (
            "no budget (the handout's whole grid)"
            if preset == "full"
            else f"budget {dev.budget_s / 60:.0f} min"
        ),
        "",
        "| stage | job | estimate (s) | what it costs |",
        "|---|---|---:|---|",
    ]
    lines += [f"| {j.stage} | {j.job} | {j.seconds:.0f} | {j.how} |" for j in jobs]
    lines += ["", "| stage | total (s) |", "|---|---:|"]
    lines += [f"| {s} | {t:.0f} |" for s, t in by_stage.items()]
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Time budgets of the presets

Written by `python -m cs336_systems.budget --out docs/budgets.md` from the config (every job the
workflow plans, its estimate and what it costs: each stage estimates its own jobs in
`stages/<stage>/plan.py`, from the machine's model and constants in `src/cs336_systems/budget/`). `tests/unit/budget/test_budget.py` holds the gpu and cpu presets to their
budgets (the gpu preset in both editions: 2025's grids are a run of the stages they change)
and fails when this file is stale. The gpu preset runs the handouts' protocol: 5 warm-up and 10
measured steps a benchmark point, 100 forward and 100 backward passes an attention point. Estimates to plan with; the profile probe's contexts
are the memory model's (core/costs.py step_memory_bytes within 79 GiB), not a measurement.

"""


def main(argv: list[str] | None = None) -> int:
    from cs336_systems import budget

    ap = argparse.ArgumentParser(
        description=budget.__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--preset", choices=sorted(DEVICES), action="append")
    ap.add_argument("--out", help="write the tables here (markdown)")
    args = ap.parse_args(argv)
    configure("budget")
    text, failed = document(args.preset or ["cpu", "gpu", "full"])
    for line in failed:
        log.error("%s", line)
    if args.out:
        atomic_write_text(args.out, text)
        log.info("wrote %s", args.out)
    return 1 if failed else 0


def document(presets: list[str], root: Path = ROOT) -> tuple[str, list[str]]:
    """The budget tables of `presets` and the over-budget verdicts (full has no budget: it is
    the handout's whole grid)."""
    parts, failed = [DOC_HEAD], []
    config = run_config(root)
    for preset in presets:
        dev = DEVICES[preset]
        jobs = plan(config, preset, dev)
        parts.append(markdown(preset, jobs, dev))
        why = check(jobs, dev)
        if why and preset != "full":
            failed.append(f"preset {preset}: {why}")
        parts.append("\n")
        if preset == "gpu":
            # the 2025 edition's own grids: a run of their stages under its own machine tag
            jobs = plan(run_config(root, 2025), preset, dev, EDITION_STAGES)
            what = f", edition 2025 (`stages=[{','.join(EDITION_STAGES)}]`)"
            parts += [markdown(preset, jobs, dev, what), "\n"]
            why = check(jobs, dev)
            if why:
                failed.append(f"preset {preset}, edition 2025: {why}")
    parts.append(calibration_markdown(copy.deepcopy(config)))
    return "".join(parts).rstrip("\n") + "\n", failed
