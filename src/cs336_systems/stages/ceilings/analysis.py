"""Report context for the `ceilings` stage. rows.py holds the table and the peaks."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, plot_main
from cs336_systems.stages.ceilings.rows import ceilings_table, copy_what, on_gpu, peaks


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return []


def context(results_dir: Path) -> dict:
    df = load(results_dir, "ceilings")
    if len(df) == 0:
        return {"available": False}
    bench = load(results_dir, "benchmark")
    model_precisions = set(bench["precision"]) if len(bench) and "precision" in bench else None
    if "path" not in df:
        df = df.assign(path="matmul")
    df = df.assign(path=df["path"].fillna("matmul"))
    gpu = on_gpu(df)
    table = ceilings_table(df, gpu, model_precisions)
    repeats = int(pd.to_numeric(df.get("repeat", pd.Series([1])), errors="coerce").max())
    warm = pd.to_numeric(df.get("warm_s", pd.Series([0.0])), errors="coerce").max()
    has_path = (df["path"] == "autocast_linear").any()
    return {
        "available": True,
        "copy_what": copy_what(gpu),
        "table": table,
        "peaks": peaks(results_dir),
        "model_path": has_path,
        "repeats": repeats,
        "warm_s": float(warm) if warm == warm else 0.0,
        "sizes": sorted({int(n) for n in df[df["kind"] == "matmul"]["size"]}),
    }


if __name__ == "__main__":
    plot_main(plot)
