"""The `fsdp` stage's runs as the report reads them: labels, constants, one run's row and its
numbers, the runs a sentence must leave out (suspect), the profiled step's busy and exposed
shares, and the section's tables (time, memory, analytic against measured bytes). Used by
analysis.py, answers.py (the sentences) and figures.py."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core.costs import MiB, training_state_bytes
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import fmt, mark_suspect, ok, pct, ran

LABELS = {
    "ddp": "DDP",
    "ddp_bf16": "DDP (bf16 autocast)",
    "sharded_optimizer": "DDP + sharded optimizer",
    "fsdp": "FSDP (fp32)",
    "fsdp_bf16": "FSDP (bf16 compute)",
    "fsdp_layer": "FSDP (fp32, per layer)",
    "fsdp_bf16_layer": "FSDP (bf16 compute, per layer)",
    "ddp_bf16_compiled": "DDP (bf16 autocast, compiled blocks)",
    "fsdp_bf16_compiled": "FSDP (bf16 compute, compiled blocks)",
    "ddp_bf16_graphed": "DDP (bf16 autocast, compiled blocks, CUDA graphs)",
    "fsdp_bf16_graphed": "FSDP (bf16 compute, compiled blocks, CUDA graphs)",
    "torch_fsdp_bf16": "PyTorch FSDP2 (bf16 compute)",
    "torch_fsdp_bf16_compiled": "PyTorch FSDP2 (bf16 compute, compiled blocks)",
}
# the peer's runs and ours they compare with
PEERS = {"torch_fsdp_bf16": "fsdp_bf16", "torch_fsdp_bf16_compiled": "fsdp_bf16_compiled"}
# a profiled step whose GPU ran kernels less than this share of it waited for the host
HOST_BOUND_BUSY = 0.8
SCHEME = {"ddp": "ddp", "sharded_optimizer": "sharded_optimizer", "fsdp": "fsdp"}
# an all-gather counts as finishing in time when compute hides at least this share of it
IN_TIME_SHARE = 0.8


def one(df: pd.DataFrame, variant: str) -> pd.Series | None:
    rows = ok(df)[ok(df)["variant"] == variant] if len(df) else df
    return rows.iloc[0] if len(rows) else None


def _suspects(df: pd.DataFrame, variants) -> list[str]:
    """Of `variants`, those that ran only as suspect rows (no sentence may rest on them)."""
    if not len(df):
        return []
    r = ran(df)
    flagged = set(r[sanity.is_suspect(r)]["variant"])
    return [v for v in variants if v in flagged and one(df, v) is None]


def left_out(df: pd.DataFrame, variants) -> str:
    """' Left out of this answer: DDP (1 suspect point excluded: see Suspect numbers).' or ''."""
    sus = _suspects(df, variants)
    if not sus:
        return ""
    names = ", ".join(LABELS.get(v, v) for v in sus)
    return f" Left out of this answer: {names}{sanity.excluded(len(sus))}."


def missing(df: pd.DataFrame, variants, failed: str) -> str:
    """What a question says when the runs it needs have no sentence: suspect, or failed."""
    return sanity.missing_answer([LABELS.get(v, v) for v in _suspects(df, variants)], failed)


def marked_label(variant: str, suspect) -> str:
    return mark_suspect(LABELS.get(variant, variant), bool(suspect))


def number(r: pd.Series | None, col: str) -> float:
    if r is None or col not in r or pd.isna(r[col]):
        return math.nan
    return float(r[col])


def busy_share(g) -> float:
    """The share of the profiled step in which the GPU ran any kernel (NaN on the CPU)."""
    busy, step = g.get("prof_gpu_busy_ms", math.nan), g.get("prof_step_ms", math.nan)
    return busy / step if busy == busy and step and step == step else math.nan


def exposed_ms(r: pd.Series) -> float:
    """The gathers' time on the profiled step's timeline outside compute (ms; rounding noise
    of the subtraction clipped at 0)."""
    t = number(r, "prof_all_gather_ms") - number(r, "prof_all_gather_overlapped_ms")
    return t if math.isnan(t) or t > 1e-6 else 0.0


def analytic(df: pd.DataFrame, shown: bool = False) -> pd.DataFrame:
    """Per scheme: the analytic state bytes per rank beside the measured held bytes; runs that
    passed the sanity checks, or with `shown` (the report's table) every run that ran, a suspect
    one's name marked."""
    d = ran(df) if shown else ok(df)
    if not len(d):
        return pd.DataFrame()
    w = int(d.iloc[0].world_size)
    flags = sanity.is_suspect(d)
    rows = []
    extra = (("ddp_bf16", "ddp"), ("fsdp_bf16", "fsdp"), ("fsdp_layer", "fsdp"))
    compiled = (
        ("ddp_bf16_compiled", "ddp"),
        ("fsdp_bf16_compiled", "fsdp"),
        ("ddp_bf16_graphed", "ddp"),
        ("fsdp_bf16_graphed", "fsdp"),
    )
    for variant, scheme in (*SCHEME.items(), *extra, ("fsdp_bf16_layer", "fsdp"), *compiled):
        these = d[d["variant"] == variant]
        if not len(these):
            continue
        r = these.iloc[0]
        s, rep = int(r.sharded_params), int(r.replicated_params)
        expect = training_state_bytes(s, rep, w, scheme) / MiB
        pad = 16 * number(r, "fsdp_pad_elems") / MiB if scheme == "fsdp" else 0.0
        expect += 0.0 if math.isnan(pad) else pad
        rows.append(
            {
                "run": marked_label(variant, flags[these.index[0]]),
                "analytic (MiB)": expect,
                "measured, tensors held (MiB)": float(r.held_mb),
                "measured − analytic (MiB)": float(r.held_mb) - expect,
            }
        )
    return pd.DataFrame(rows)


WAITED = "compute waited for all-gathers (ms)"  # (GPU runs that measured it)


def time_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every run that ran, a suspect one's step time marked."""
    rows = []
    d = ran(df)
    for r, flag in zip(d.itertuples(), sanity.is_suspect(d), strict=True):
        g = r._asdict()
        rows.append(
            {
                "run": LABELS.get(r.variant, r.variant),
                "step (ms)": mark_suspect(f"{fmt(r.step_ms_mean)} ± {fmt(r.step_ms_std)}", flag),
                "forward (ms)": r.fwd_ms_mean,
                "backward (ms)": r.bwd_ms_mean,
                "sync after backward (ms)": r.comm_ms_mean,
                "optimizer (ms)": r.opt_ms_mean,
                "collective calls / step": calls_text(g),
                "all-gather MiB / step": g.get("all_gather_into_tensor_mb", math.nan),
                "reduce-scatter MiB / step": g.get("reduce_scatter_tensor_mb", math.nan),
                "all-reduce MiB / step": g.get("all_reduce_mb", math.nan),
                "all-gather on timeline (ms)": g.get("prof_all_gather_ms", math.nan),
                "all-gather hidden": pct(g.get("prof_all_gather_overlap_share", math.nan)),
                WAITED: fmt(g.get("prof_all_gather_waited_ms", math.nan)),
                "GPU busy in the profiled step": busy_text(g),
            }
        )
    return pd.DataFrame(rows)


def calls_text(g: dict) -> str:
    kinds = (
        ("all_gather_into_tensor", "AG"),
        ("reduce_scatter_tensor", "RS"),
        ("all_reduce", "AR"),
    )
    if g.get("collectives_counted") in (False, "False"):
        return "not counted"  # the peer's collectives bypass the counting ones
    parts = [(g.get(f"{k}_calls", math.nan), name) for k, name in kinds]
    return ", ".join(f"{int(n)} {name}" for n, name in parts if n == n and n > 0) or "0"


def busy_text(g) -> str:
    b = busy_share(g)
    return "n/a" if b != b else f"{pct(b)} of {fmt(g['prof_step_ms'], 0)} ms"


MEMORY_ROWS = [
    ("params_mb", "parameters held"),
    ("grads_mb", "gradients held"),
    ("optimizer_state_mb", "optimizer state held"),
    ("held_mb", "parameters + gradients + optimizer state"),
    ("gathered_peak_mb", "most gathered full weights at once"),
    ("mem_init_allocated_mb", "allocated after construction"),
    ("mem_init_peak_mb", "peak during construction"),
    ("mem_forward_peak_mb", "peak during forward"),
    ("mem_backward_peak_mb", "peak during backward (and sync)"),
    ("mem_before_step_allocated_mb", "allocated before optimizer step"),
    ("mem_after_step_allocated_mb", "allocated after optimizer step"),
    ("mem_step_peak_mb", "peak during optimizer step"),
    ("mem_reserved_mb", "reserved by the allocator after the step (CUDA graphs' pools too)"),
]


def memory_table(df: pd.DataFrame, measured: bool) -> pd.DataFrame:
    """Every run that ran, one column each (a suspect run's name marked)."""
    d = ran(df)
    rows = MEMORY_ROWS if measured else MEMORY_ROWS[:5]
    out = {"MiB per rank (max over ranks)": [label for _, label in rows]}
    for r, flag in zip(d.itertuples(), sanity.is_suspect(d), strict=True):
        out[marked_label(r.variant, flag)] = [getattr(r, col, math.nan) for col, _ in rows]
    return pd.DataFrame(out)
