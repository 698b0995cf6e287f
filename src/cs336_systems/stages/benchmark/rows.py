"""The benchmark stage's rows as the report reads them: the loaders (MFU against this run's
ceilings), backward over forward, speedups along one axis, the warm-up sweep's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, ok, ran
from cs336_systems.stages.benchmark.mfu import add_mfu

KEYS = ["size", "context_length", "precision", "compile", "attention"]
WHY_FIRST_STEP = {
    "cuda": "The first step costs more because it pays one-time work that later steps reuse: "
    "library handles (cuBLAS, cuDNN) are created, kernels are loaded and their algorithms chosen, "
    "and the caching allocator grows its pool with real cudaMalloc calls.",
    "cpu": "The first step costs more because it pays one-time work that later steps reuse: the "
    "allocator grows the process's heap (page faults on fresh memory), and the CPU kernels' "
    "one-time dispatch and primitive caches are filled.",
}
MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}


def load_all_engines(results_dir: Path) -> pd.DataFrame:
    """benchmark.csv with MFU recomputed against this run's ceilings (the model's paths), then
    checked: every engine's rows (engines.py)."""
    ceilings = load(results_dir, "ceilings")
    return load(results_dir, "benchmark", derive=lambda df: add_mfu(df, ceilings))


def load_benchmark(results_dir: Path) -> pd.DataFrame:
    """The plain model's rows (the grid every table and figure but the engines' reads)."""
    df = load_all_engines(results_dir)
    return df[df["engine"] == "plain"] if "engine" in df else df


def _eager_naive(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["compile"] == "eager") & (df["attention"] == "naive")]


def backward_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """backward time (forward+backward minus forward) over forward time, per point (of `df`'s
    rows that ran: pass `ok(df)` to leave suspect ones out)."""
    d = ran(df)
    fwd = d[d["mode"] == "forward"].set_index(KEYS)["step_ms_mean"]
    fb = d[d["mode"] == "forward_backward"].set_index(KEYS)["step_ms_mean"]
    both = pd.concat({"forward_ms": fwd, "fwd_bwd_ms": fb}, axis=1).dropna()
    both["backward_ms"] = both["fwd_bwd_ms"] - both["forward_ms"]
    both["ratio"] = both["backward_ms"] / both["forward_ms"]
    return both.reset_index()


def speedups(df: pd.DataFrame, axis: str, base: str, fast: str) -> pd.DataFrame:
    """base-time / fast-time along one axis (precision fp32->bf16, or compile eager->compiled),
    over `df`'s rows that ran (pass `ok(df)` to leave suspect ones out)."""
    d = ran(df)
    keys = [k for k in [*KEYS, "mode"] if k != axis]
    a = d[d[axis] == base].set_index(keys)["step_ms_mean"]
    b = d[d[axis] == fast].set_index(keys)["step_ms_mean"]
    both = pd.concat({f"{base}_ms": a, f"{fast}_ms": b}, axis=1).dropna()
    both["speedup"] = both[f"{base}_ms"] / both[f"{fast}_ms"]
    return both.reset_index()


def warmup_summary(w: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for r in ok(w).itertuples():
        times = json.loads(r.step_times_ms)
        rows.append(
            {
                "size": r.size,
                "warmup_steps": r.warmup_steps,
                "mean_ms": r.step_ms_mean,
                "std_ms": r.step_ms_std,
                "first_measured_ms": times[0],
                "median_ms": r.step_ms_median,
                "n_measured": len(times),
                "cv": r.step_ms_std / r.step_ms_mean,
            }
        )
    return pd.DataFrame(rows)
