"""The `ddp` stage's runs as the report reads them: a run's label, the variants job's rows, one
run that passed the checks, the runs a sentence must leave out (suspect), the optimizer each
run recorded, the latency-bandwidth fits the bucket-size model uses, and the section's tables
(variants, bucket sizes against the model, memory with and without sharding). Used by
analysis.py, answers.py (the sentences) and figures.py."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core.costs import MiB
from cs336_systems.parallel.ddp import overhead_model
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import (
    fit_latency_bandwidth,
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


def comm_fits(df: pd.DataFrame, allreduce: pd.DataFrame) -> dict[str, dict]:
    """Latency o (s) and bandwidth w (B/s) from the all-reduce stage (same backend, world size,
    default buffers; its suspect points left out, `suspect` counts them) and from this stage's
    naive and flat runs (per-call cost from their difference: naive makes one call per gradient
    tensor, flat one)."""
    fits: dict[str, dict] = {}
    d = variant_runs(df)
    if len(d) == 0:
        return fits
    backend, n = d["backend"].iloc[0], int(d["world_size"].iloc[0])
    if len(allreduce):
        f = fit_latency_bandwidth(allreduce)
        if len(f):
            f = f[(f["backend"] == backend) & (f["world_size"] == n) & (f["buffers"] == "default")]
        if len(f):
            r = f.iloc[0]
            fits["allreduce stage"] = {
                "o": r.latency_us * 1e-6,
                "w": r.bandwidth_gbps * 1e9,
                "suspect": int(r.suspect),
            }
    naive, flat = one(d, "naive"), one(d, "flat")
    if naive is not None and flat is not None and naive.num_grad_tensors > 1:
        s = naive.grad_mb * MiB
        o = (naive.comm_ms_mean - flat.comm_ms_mean) * 1e-3 / (naive.num_grad_tensors - 1)
        if o > 0 and flat.comm_ms_mean * 1e-3 > o:
            fits["naive vs flat DDP runs"] = {"o": o, "w": s / (flat.comm_ms_mean * 1e-3 - o)}
    return fits


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


# the memory table's rows: column, label
MEMORY_ROWS = {
    "params_mb": "parameters",
    "grads_mb": "gradients",
    "optimizer_state_mb": "optimizer state (this rank)",
    "mem_init_peak_mb": "peak after construction",
    "mem_before_step_peak_mb": "peak before optimizer step",
    "mem_after_step_peak_mb": "peak after optimizer step",
    "step_ms_mean": "step (ms)",
    "opt_ms_mean": "optimizer step (ms)",
}


def memory_table(shown: pd.DataFrame) -> str:
    """The sharding runs that ran (`shown`), one column each (a suspect run's name marked)."""
    t = shown.set_index("variant")[list(MEMORY_ROWS)].rename(columns=MEMORY_ROWS).T
    flags = dict(zip(shown["variant"], sanity.is_suspect(shown), strict=True))
    t = t.rename(columns={v: mark_suspect(v, bool(f)) for v, f in flags.items()})
    t = t.reset_index().rename(columns={"index": "MiB per rank (max over ranks)"})
    t.columns.name = None
    return md_table(t)
