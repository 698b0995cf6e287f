"""Render report/<machine>/report.md from the run's CSVs with jinja2.

    python -m cs336_systems.report --results results/M --out report/M/report.md --stages a,b

Every number and sentence comes from the stage analyses (cs336_systems.analysis.<stage>.context).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
from pathlib import Path

import jinja2
import pandas as pd

from cs336_systems.analysis.common import fmt, md_table, pct
from cs336_systems.results import PROVENANCE_COLUMNS, atomic_write_text

TEMPLATES = Path(__file__).resolve().parents[2] / "report" / "templates"
STAGE_TITLES = {
    "kernel_tests": "Kernel tests",
    "ceilings": "Machine ceilings",
    "benchmark": "End-to-end benchmarks",
    "profile": "Profiling",
    "precision": "Mixed precision",
    "memory": "Memory",
    "attention": "Attention",
    "flash": "FlashAttention-2",
    "allreduce": "Distributed communication",
    "ddp": "Data-parallel training and optimizer-state sharding",
}
# the order sections appear in (stages not listed come last, alphabetically)
STAGE_ORDER = list(STAGE_TITLES)


def order_stages(stages: list[str]) -> list[str]:
    return sorted(stages, key=lambda s: (STAGE_ORDER.index(s) if s in STAGE_ORDER else 99, s))


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
        module = importlib.import_module(f"cs336_systems.analysis.{stage}")
        ctx = module.context(Path(results_dir))
        body = env.get_template(f"sections/{stage}.md.j2").render(s=ctx, fig_dir=fig_dir)
        sections.append({"stage": stage, "title": STAGE_TITLES.get(stage, stage), "body": body})
    return env.get_template("report.md.j2").render(h=header(Path(results_dir)), sections=sections)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stages", required=True)
    args = ap.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    fig_dir = os.path.relpath(args.out.parent / "figures", args.out.parent)
    text = render(args.results, stages, fig_dir)
    atomic_write_text(args.out, text)
    print(
        f"[report] wrote {args.out} ({len(text.splitlines())} lines, stages: {', '.join(stages)})"
    )


if __name__ == "__main__":
    main()
