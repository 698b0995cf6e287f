"""Render report/<machine>/report.md from the run's CSVs with jinja2.

    python -m cs336_systems.report --results results/M --out report/M/report.md --stages a,b

Every number and sentence comes from the stage analyses (`cs336_systems.stages.<stage>.analysis.context`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
from pathlib import Path

import jinja2
import pandas as pd

from cs336_systems.core.analysis import fmt, md_table, pct
from cs336_systems.core.log import configure, get_logger
from cs336_systems.core.results import PROVENANCE_COLUMNS, atomic_write_text

log = get_logger(__name__)
TEMPLATES = Path(__file__).resolve().parents[2] / "report" / "templates"


def stage_package(stage: str):
    """The stage's package (`cs336_systems.stages.<stage>`): its TITLE and ORDER."""
    return importlib.import_module(f"cs336_systems.stages.{stage}")


def order_stages(stages: list[str]) -> list[str]:
    """Sections in the stages' own ORDER, then by name."""
    return sorted(stages, key=lambda s: (getattr(stage_package(s), "ORDER", 999), s))


def header(results_dir: Path) -> dict:
    """Machine, device, versions, preset and commit from the CSVs' provenance columns; run time
    from Snakemake's per-job benchmark files."""
    frames = []
    for csv in sorted(Path(results_dir).glob("*.csv")):
        try:
            df = pd.read_csv(csv, usecols=lambda c: c in PROVENANCE_COLUMNS)
        except (pd.errors.EmptyDataError, ValueError):
            continue
        if len(df):
            frames.append(df)
    prov = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def values(col: str) -> str:
        if col not in prov:
            return "–"
        return ", ".join(str(v) for v in sorted(prov[col].dropna().astype(str).unique()))

    job_seconds = 0.0
    n_jobs = 0
    for tsv in Path(results_dir, "jobs").rglob("*.tsv"):
        try:
            job_seconds += float(pd.read_csv(tsv, sep="\t")["s"].sum())
            n_jobs += 1
        except (pd.errors.EmptyDataError, KeyError, ValueError):
            continue
    stamps = pd.to_datetime(prov["timestamp"], utc=True) if "timestamp" in prov else pd.Series()
    return {
        "machine": values("machine"),
        "device_name": values("device_name"),
        "torch": values("torch"),
        "triton": values("triton"),
        "cuda": values("cuda"),
        "preset": values("preset"),
        "git_commit": values("git_commit"),
        "first_result": stamps.min().isoformat() if len(stamps) else "–",
        "last_result": stamps.max().isoformat() if len(stamps) else "–",
        "job_minutes": job_seconds / 60,
        "n_jobs": n_jobs,
        "rendered": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def render(
    results_dir: Path, stages: list[str], fig_dir: str = "figures", templates: Path = TEMPLATES
) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(fmt=fmt, pct=pct)
    env.globals.update(md_table=md_table)
    sections = []
    for stage in order_stages(stages):
        module = importlib.import_module(f"cs336_systems.stages.{stage}.analysis")
        ctx = module.context(Path(results_dir))
        body = env.get_template(f"sections/{stage}.md.j2").render(s=ctx, fig_dir=fig_dir)
        sections.append({"stage": stage, "title": stage_package(stage).TITLE, "body": body})
    return env.get_template("report.md.j2").render(h=header(Path(results_dir)), sections=sections)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stages", required=True)
    args = ap.parse_args(argv)
    configure("report")
    stages = [s for s in args.stages.split(",") if s]
    fig_dir = os.path.relpath(args.out.parent / "figures", args.out.parent)
    text = render(args.results, stages, fig_dir)
    atomic_write_text(args.out, text)
    log.info("wrote %s (%d lines, stages: %s)", args.out, len(text.splitlines()), ", ".join(stages))


if __name__ == "__main__":
    main()
