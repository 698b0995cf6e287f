"""Report context and figures for the `allreduce` stage (question 22): rows.py holds the points
and tables as the report reads them, answers.py the sentences, figures.py the figures."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import load, ok, plot_main, ran
from cs336_systems.stages.allreduce import answers
from cs336_systems.stages.allreduce.figures import draw
from cs336_systems.stages.allreduce.rows import (
    fit_table,
    not_run_table,
    pivot,
    rejected_fits,
    with_defaults,
)

HOW = {"gloo": "gloo between CPU processes", "nccl": "NCCL with one process per GPU"}


def _started(df: pd.DataFrame) -> str:
    """How the ranks were started: by the stage on one node, by srun's torchrun on several."""
    nodes = int(df["nnodes"].max()) if "nnodes" in df and df["nnodes"].notna().any() else 1
    if nodes > 1:
        return f"started through `srun` and `torchrun` on up to {nodes} nodes"
    return "started by the stage itself on one node"


def _points(df: pd.DataFrame, shown: pd.DataFrame) -> dict:
    """What ran: the backends, the points and their statuses, the suspect ones, the largest
    relative error of a checked sum, the iterations, and the points that did not run."""
    used = set(shown["backend"]) if len(shown) else set(df["backend"])
    return {
        "backends_text": ", ".join(HOW[b] for b in ("gloo", "nccl") if b in used),
        "started_text": _started(shown if len(shown) else df),
        "n_points": len(df),
        "n_ran": len(shown),
        "n_suspect": sanity.n_suspect(shown),
        "statuses": df["status"].value_counts().to_dict(),
        "failed_table": not_run_table(df),
        "iterations": answers.iterations(shown),
        "max_rel_err": float(shown["max_rel_err"].max()) if len(shown) else math.nan,
    }


def _tables(df: pd.DataFrame) -> dict[str, str]:
    """The time (bus bandwidth) table of each backend and buffers kind that has points."""
    tables = {}
    for backend in ("gloo", "nccl"):
        for buffers in sorted(set(df["buffers"])):
            text = pivot(df, backend, buffers)
            if text:
                tables[backend + ("" if buffers == "default" else f" ({buffers} buffers)")] = text
    return tables


def _q22(df: pd.DataFrame, d: pd.DataFrame, shown: pd.DataFrame) -> dict:
    """Q22: the tables, the fits, and the sentences on the points that passed the checks."""
    return {
        "tables": _tables(df),
        "fit_table": fit_table(df),  # suspect rows left out
        "sentences": answers.sentences(d, shown),
        "compare": answers.compare(d),
        "best": answers.best(d),
        "nccl_note": answers.nccl_note(df, d),
        "grid": answers.grid(df),
        "oversubscribed": answers.oversubscribed(shown),
        "commands": _commands(df),
        "rejected_fits": rejected_fits(df),
    }


def _commands(df: pd.DataFrame) -> list[str]:
    """The commands that measure the skipped points on a host that can run them."""
    if "command" not in df:
        return []
    skipped = df[df["status"].astype(str).str.startswith("skipped")]
    return sorted(set(skipped["command"].dropna().astype(str)) - {""})


def context(results_dir: Path) -> dict:
    df = with_defaults(load(results_dir, "allreduce"))
    if len(df) == 0:
        return {"available": False}
    d, shown = ok(df), ran(df)
    # the stage's rows in nccl-tests' layout, beside its CSVs (nccl_tests.py)
    texts = sorted(p.name for p in (Path(results_dir) / "allreduce").glob("*.nccl-tests.txt"))
    return {
        "available": True,
        **_points(df, shown),
        **_q22(df, d, shown),
        "nccl_tests_files": texts,
    }


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    """The section's figures (stages/allreduce/figures.py)."""
    return draw(results_dir, fig_dir)


if __name__ == "__main__":
    plot_main(plot)
