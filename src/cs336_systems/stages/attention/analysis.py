"""Report context for the `attention` stage: naive attention time and memory over head dim x
length, out-of-memory points and their memory accounting, torch.compile speedups (and the whole
model's, from the benchmark stage). rows.py holds the tables, answers.py the sentences,
figures.py the figures; each question's part of the context is composed here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, plot_main, status_counts
from cs336_systems.stages.attention import answers
from cs336_systems.stages.attention.figures import draw
from cs336_systems.stages.attention.rows import (
    compile_table,
    failed_table,
    model_compile,
    model_compile_table,
    points,
    speedups,
    timing_table,
)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return draw(results_dir, fig_dir)


def compile_summary(df: pd.DataFrame) -> dict:
    """torch.compile against eager naive attention: the table, the speed-ups and where
    compiled is slower."""
    sp = speedups(df)
    if len(sp) == 0:
        return {"available": False}
    return {
        "available": True,
        "table": compile_table(sp),
        "sentence": answers.compile_sentence(df, sp),
        "losers": answers.compile_losers(sp),
    }


def whole_model_compile(results_dir: Path) -> dict:
    """Eager vs compiled end-to-end step time from the benchmark stage, if it ran."""
    bench = load(results_dir, "benchmark")
    if len(bench) == 0 or "compile" not in bench:
        return {"available": False}
    table = model_compile(bench)
    if len(table) == 0:
        return {"available": False}
    sentence = answers.model_compile_sentence(table)
    return {"available": True, "table": model_compile_table(table), "sentence": sentence}


def context(results_dir: Path) -> dict:
    df = load(results_dir, "attention")
    if len(df) == 0:
        return {"available": False}
    df = points(df)
    first = df.iloc[0]
    statuses = status_counts(df)
    return {
        "available": True,
        "device": first.get("device", "?"),
        "dtypes": sorted(str(x) for x in df["dtype"].dropna().unique()) if "dtype" in df else [],
        "batch_size": int(first["batch_size"]),
        "causal": bool(first["causal"]),
        "warmup_steps": int(first["warmup_steps"]),
        "fwd_steps": int(first["fwd_steps"]),
        "bwd_steps": int(first["bwd_steps"]),
        "head_dims": sorted(int(x) for x in df["d_head"].unique()),
        "seq_lens": sorted(int(x) for x in df["seq_len"].unique()),
        "impls": sorted(df["impl"].unique()),
        "n_points": len(df),
        "statuses": statuses,
        "timing_table": timing_table(df),
        "failed_table": failed_table(df),
        "oom": answers.oom_accounting(df),
        "growth": answers.growth_sentence(df),
        "compile": compile_summary(df),
        "model_compile": whole_model_compile(results_dir),
        "bwd_fwd": answers.bwd_fwd_sentence(df),
    }


if __name__ == "__main__":
    plot_main(plot)
