"""The benchmark stage's rows as the report reads them: the loaders (MFU against this run's
ceilings), backward over forward, speedups along one axis, the host-bound points, the warm-up
sweep's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import load, ok, ran
from cs336_systems.reporting.host_bound import host_bound
from cs336_systems.stages.benchmark.mfu import add_mfu

KEYS = ["size", "context_length", "precision", "compile", "attention"]
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


def eager_naive(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the model as the handout benchmarks it: eager, naive attention."""
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


# what bf16 autocast does to each phase's device work: the matmuls run at the bf16 ceiling in
# forward and backward; AdamW updates the fp32 master weights in both precisions, so bf16 does
# not shrink the optimizer's work and the rule cannot call it host-bound (`work_ratio` 1)
PHASE_WORK = {"fwd": "peak", "bwd": "peak", "opt": "same"}


def phase_host_bound(d: pd.DataFrame) -> pd.DataFrame:
    """The same rule (`host_bound`) on each phase of the training steps (forward, backward,
    optimizer step: their median times inside the step), `phase` naming it."""
    t = d[d["mode"] == "train_step"]
    out = [
        host_bound(t, f"{ph}_ms_median", work).assign(phase=ph)
        for ph, work in PHASE_WORK.items()
        if f"{ph}_ms_median" in t
    ]
    out = [x for x in out if len(x)]
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def host_bound_points(d: pd.DataFrame, hb: pd.DataFrame) -> pd.DataFrame:
    """Every mode's and precision's rows at a point (size, context, compile, attention) where
    some mode is host-bound: a host-bound forward makes the same point's other passes
    host-bound too (the same kernels, launched from the same Python), also where their own pair
    was flagged."""
    keys = ["size", "context_length", "compile", "attention"]
    if not len(hb):
        return hb
    at = hb[keys].drop_duplicates()
    return d.merge(at, on=keys)[[*keys, "mode", "precision"]].drop_duplicates()


def without_points(r: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """`r`'s rows but those at `points` (host_bound_points: size, context, compile, attention,
    mode and precision)."""
    if not (len(points) and len(r)):
        return r
    keys = ["size", "context_length", "precision", "compile", "attention"]
    hit = r.merge(points[keys].drop_duplicates(), on=keys, how="left", indicator=True)
    return r[(hit["_merge"] != "both").to_numpy()]


# the phases' means may exceed the step's by this share before a row is flagged (CUDA events
# inside the step against the host clock around it: the parts cannot exceed the whole)
PARTS_SLACK = 0.001


def parts_vs_whole(g: pd.DataFrame) -> pd.DataFrame:
    """Per size of `g` (train-step rows by size): the three phases' sum against the step, on
    means (a mean of sums is the sum of means: the parts add to what they divide; medians do
    not), `gap_ms` the step minus the parts, `over` where the parts exceed the step."""
    cols = ("fwd", "bwd", "opt")
    stat = "mean" if all(f"{c}_ms_mean" in g for c in cols) else "median"
    parts = sum(g[f"{c}_ms_{stat}"] for c in cols)
    step = g[f"step_ms_{stat}"]
    out = pd.DataFrame({"parts_ms": parts, "step_ms": step, "share": parts / step})
    out["gap_ms"] = step - parts
    out["over"] = out["share"] > 1 + PARTS_SLACK
    out.attrs["stat"] = stat
    return out


def device_of(df: pd.DataFrame) -> str:
    """`cuda` or `cpu`: the rows' `device`, else their provenance's GPU count."""
    if "device" in df and df["device"].notna().any():
        return str(df["device"].dropna().iloc[0])
    gpus = pd.to_numeric(df.get("gpu_count", pd.Series(dtype=float)), errors="coerce")
    return "cuda" if gpus.fillna(0).max() > 0 else "cpu"


def warmup_summary(w: pd.DataFrame) -> pd.DataFrame:
    """One row per warm-up count of the sweep: the measured steps' mean, std, median and the
    first measured step."""
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
