"""The `ddp` stage's runs as the report reads them: a run's label, the variants job's rows, one
run that passed the checks, the runs a sentence must leave out (suspect), the optimizer each
run recorded, the latency-bandwidth fits the bucket-size model uses, and the section's tables
(variants, bucket sizes against the model, memory with and without sharding). Used by
analysis.py, answers.py (the sentences) and figures.py."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core.costs import MiB, overhead_model
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    fit_latency_bandwidth,
    fit_problem,
    fmt,
    mark_suspect,
    md_table,
    ok,
    pct,
    ran,
)
from cs336_systems.stages.ddp.peer import BUCKET_MB as PEER_BUCKET_MB


def run_label(variant: str, bucket: float | None) -> str:
    if variant == "bucketed":
        return f"bucketed {bucket:g} MiB"
    return {
        "baseline": "compute only (1 process)",
        "overlap": "overlap (per parameter)",
        "torch_ddp": f"PyTorch DDP (peer, {PEER_BUCKET_MB:g} MiB buckets)",
    }.get(variant, variant)


def variant_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The variants job's rows (empty where there are none)."""
    if len(df) == 0 or "kind" not in df:
        return pd.DataFrame()
    return df[df["kind"] == "variants"].copy()


def one(d: pd.DataFrame, variant: str) -> pd.Series | None:
    """The run of `variant` that passed the checks, or None."""
    rows = ok(d)[ok(d)["variant"] == variant]
    return rows.iloc[0] if len(rows) else None


def is_suspect_run(d: pd.DataFrame, variant: str) -> bool:
    """The variant ran, but only as a suspect row (no sentence may rest on it)."""
    r = ran(d)
    return one(d, variant) is None and bool(sanity.is_suspect(r[r["variant"] == variant]).any())


def optimizer_names(df: pd.DataFrame) -> list[str]:
    """The optimizer implementations the runs that ran recorded (`model.optimizer_impl`)."""
    r = ran(df)
    return sorted(set(r["optimizer"].dropna())) if "optimizer" in r else []


def _stage_fit(allreduce: pd.DataFrame, backend: str, n: int) -> dict | None:
    """The all-reduce stage's fit at this backend and world size (default buffers)."""
    if not len(allreduce):
        return None
    f = fit_latency_bandwidth(allreduce)
    if len(f):
        f = f[(f["backend"] == backend) & (f["world_size"] == n) & (f["buffers"] == "default")]
    if not len(f):
        return None
    r = f.iloc[0]
    return {
        "o": r.latency_us * 1e-6,
        "w": r.bandwidth_gbps * 1e9,
        "suspect": int(r.suspect),
        "problem": str(r.problem),
        "min_time_us": float(r.min_time_us),
    }


def _pair_fit(naive: pd.Series, flat: pd.Series, stage: dict | None) -> dict:
    """Per-call cost and bandwidth from the naive and flat runs: naive makes one call per
    gradient tensor, flat one, over the same bytes, so o = (naive − flat) / (calls − 1). Its
    `problem` says why it cannot be quoted: a negative or unphysical cost, a difference within
    the runs' std, or a cost far below the all-reduce stage's own per-call cost."""
    calls = int(naive.num_grad_tensors)
    diff_ms = float(naive.comm_ms_mean - flat.comm_ms_mean)
    o = diff_ms * 1e-3 / (calls - 1)
    rest = flat.comm_ms_mean * 1e-3 - o
    w = naive.grad_mb * MiB / rest if rest > 0 else math.nan
    noise = float(max(naive.comm_ms_std, flat.comm_ms_std))
    if o < 0:
        problem = (
            f"flat communicates {fmt(-diff_ms)} ms longer than naive: a negative per-call cost"
        )
    elif abs(diff_ms) <= noise:
        problem = (
            f"naive and flat communication differ by {fmt(diff_ms)} ms, within their std "
            f"({fmt(noise)} ms)"
        )
    else:
        problem = fit_problem(o * 1e6, w / 1e9)
    if not problem and stage and not stage["problem"] and o < stage["o"] / 10:
        problem = (
            f"{fmt(o * 1e6)} µs per call is below a tenth of the all-reduce stage's measured "
            f"{fmt(stage['o'] * 1e6)} µs"
        )
    return {"o": o, "w": w, "problem": problem}


def comm_fits(df: pd.DataFrame, allreduce: pd.DataFrame) -> dict[str, dict]:
    """Latency o (s) and bandwidth w (B/s) from the all-reduce stage (same backend, world size,
    default buffers; its suspect points left out, `suspect` counts them) and from this stage's
    naive and flat runs. Each fit's `problem` is '' where its parameters are physical
    (`reporting/analysis.py:fit_problem`); a fit with a problem is listed, never used
    (`usable`)."""
    fits: dict[str, dict] = {}
    d = variant_runs(df)
    if len(d) == 0:
        return fits
    stage = _stage_fit(allreduce, d["backend"].iloc[0], int(d["world_size"].iloc[0]))
    if stage is not None:
        fits["allreduce stage"] = stage
    naive, flat = one(d, "naive"), one(d, "flat")
    if naive is not None and flat is not None and naive.num_grad_tensors > 1:
        fits["naive vs flat DDP runs"] = _pair_fit(naive, flat, stage)
    return fits


def usable(fits: dict[str, dict]) -> dict[str, dict]:
    """The fits whose parameters are physical: the only ones a model or sentence uses."""
    return {name: f for name, f in fits.items() if not f.get("problem")}


def bucket_table(df: pd.DataFrame, fit: dict | None) -> pd.DataFrame:
    """Every bucketed run that ran (column `suspect`: failed a sanity check), with the model's
    step beside it (the compute-only step of a baseline that passed the checks)."""
    d = ran(variant_runs(df))
    base = one(d, "baseline")
    b = d[d["variant"] == "bucketed"].sort_values("bucket_size_mb")
    rows = []
    for r, flag in zip(b.itertuples(), sanity.is_suspect(b), strict=True):
        row = {
            "suspect": bool(flag),
            "bucket (MiB)": r.bucket_size_mb,
            "buckets": int(r.num_buckets),
            "step (ms)": r.step_ms_mean,
            "std (ms)": r.step_ms_std,
            "sync after backward (ms)": r.comm_ms_mean,
        }
        if fit is not None and base is not None:
            over = overhead_model(r.grad_mb * MiB, fit["w"], fit["o"], r.num_buckets)
            row["model overhead (ms)"] = over * 1e3
            row["model step (ms)"] = base.step_ms_mean + over * 1e3
        rows.append(row)
    return pd.DataFrame(rows)


def shown_buckets(bt: pd.DataFrame) -> str:
    """The bucket table as printed: a suspect run's step time marked."""
    t = bt.drop(columns="suspect")
    t["step (ms)"] = [
        mark_suspect(fmt(v), f) for v, f in zip(bt["step (ms)"], bt["suspect"], strict=True)
    ]
    return md_table(t)


def variant_table(d: pd.DataFrame, base_ms: float) -> pd.DataFrame:
    """Every variant run that ran, a suspect one's step time marked."""
    rows = []
    shown = ran(d)
    for r, flag in zip(shown.itertuples(), sanity.is_suspect(shown), strict=True):
        bucket = r.bucket_size_mb if r.variant == "bucketed" else None
        row = {
            "run": run_label(r.variant, bucket),
            "step (ms)": mark_suspect(f"{fmt(r.step_ms_mean)} ± {fmt(r.step_ms_std)}", flag),
            "fwd+bwd (ms)": r.fwd_bwd_ms_mean,
            "sync (ms)": r.comm_ms_mean,
            "optimizer (ms)": r.opt_ms_mean,
            "sync share": pct(r.comm_share) if r.variant != "baseline" else "–",
            "vs compute only": f"{fmt(r.step_ms_mean / base_ms)}×" if base_ms else "–",
        }
        if len(optimizer_names(d)) > 1:
            row["optimizer"] = getattr(r, "optimizer", "–")
        if "prof_overlap_share" in d:
            share = getattr(r, "prof_overlap_share", math.nan)
            row["NCCL time overlapped"] = pct(share) if isinstance(share, float) else "–"
        rows.append(row)
    return pd.DataFrame(rows)


def sharding_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The sharding job's rows that ran (empty where there are none)."""
    if len(df) == 0 or "kind" not in df:
        return pd.DataFrame()
    return ran(df[df["kind"] == "sharding"])


# the memory table's rows: column, label. The three points of the handout: after building the
# model and optimizer, just before the optimizer step, just after it; each peak counts from the
# previous point (measure.py resets the counter), so the step's two peaks differ
MEMORY_ROWS = {
    "params_mb": "parameters",
    "grads_mb": "gradients",
    "optimizer_state_mb": "optimizer state (this rank)",
    "mem_init_allocated_mb": "allocated after model and optimizer init",
    "mem_init_peak_mb": "peak up to init",
    "mem_before_step_allocated_mb": "allocated just before the optimizer step",
    "mem_before_step_peak_mb": "peak of forward+backward (reset at the step's start)",
    "mem_after_step_allocated_mb": "allocated just after the optimizer step",
    "mem_after_step_peak_mb": "peak of the optimizer step (reset right before it)",
    "step_ms_mean": "step (ms)",
    "opt_ms_mean": "optimizer step (ms)",
}
# what a CPU run cannot measure: the CUDA allocator's counters
ALLOCATOR_ROWS = tuple(c for c in MEMORY_ROWS if c.startswith("mem_"))


def peaks_reset(shown: pd.DataFrame) -> bool:
    """Whether the runs' peaks count from the previous point (rows before `mem_peaks_reset`
    existed kept one counter from the start: their before- and after-step peaks are one)."""
    return "mem_peaks_reset" in shown and bool(shown["mem_peaks_reset"].fillna(False).all())


def memory_table(shown: pd.DataFrame) -> str:
    """The sharding runs that ran (`shown`), one column each (a suspect run's name marked); the
    allocator's rows only where they were measured (CUDA)."""
    rows = dict(MEMORY_ROWS)
    if not shown["mem_after_step_peak_mb"].notna().any():
        rows = {c: v for c, v in rows.items() if c not in ALLOCATOR_ROWS}
    elif not peaks_reset(shown):
        rows["mem_before_step_peak_mb"] = "peak up to just before the optimizer step"
        rows["mem_after_step_peak_mb"] = "peak up to just after the optimizer step"
    t = shown.set_index("variant")[list(rows)].rename(columns=rows).T
    flags = dict(zip(shown["variant"], sanity.is_suspect(shown), strict=True))
    t = t.rename(columns={v: mark_suspect(v, bool(f)) for v, f in flags.items()})
    t = t.reset_index().rename(columns={"index": "MiB per rank (max over ranks)"})
    t.columns.name = None
    return md_table(t)
