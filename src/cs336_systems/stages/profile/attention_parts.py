"""Q9's pieces for the `profile` stage: attention's parts (the matmuls counted by their GEMM
kernels, the 1/sqrt(d) scaling on its own) and which units ran the matmuls, by kernel name."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.core.analysis import ok, pct, sort_sizes
from cs336_systems.core.costs import attention_flops_split
from cs336_systems.profiling.kernel_classes import gemm_unit

# the parts of attention the Q9 table shows: the annotated ranges, with the 1/sqrt(d) scaling
# apart from the QK^T matmul (captures from before the `scale` range had it inside
# `qk_matmul`: its non-GEMM kernels there are the scaling) and non-GEMM work of the PV range
# (copies, casts) apart from its matmul
ATTN_PARTS = ("qk_matmul", "scale", "mask", "softmax", "pv_matmul", "pv_other")
MATMUL_PARTS = ("qk_matmul", "pv_matmul")


def _attention_parts(kernels: pd.DataFrame, size, ctx) -> dict[str, float] | None:
    """ms per step of each ATTN_PARTS part of one forward point, from its kernels in the
    annotated ranges: a matmul part counts only GEMM kernels; the scaling is its own range or,
    in older captures, the non-GEMM kernels of the QK^T range."""
    if kernels is None or kernels.empty or "phase" not in kernels:
        return None
    k = kernels[
        (kernels["mode"] == "forward")
        & (kernels["size"] == size)
        & (kernels["context_length"] == ctx)
        & kernels["phase"].astype(str).str.startswith("attention.")
    ]
    if k.empty:
        return None
    part = k["phase"].str.removeprefix("attention.")
    gemm = k["kernel_class"] == "gemm"
    ms = k["ms_per_step"]

    def total(mask) -> float:
        return float(ms[mask].sum())

    return {
        "qk_matmul": total((part == "qk_matmul") & gemm),
        "scale": total((part == "scale") | ((part == "qk_matmul") & ~gemm)),
        "mask": total(part == "mask"),
        "softmax": total(part == "softmax"),
        "pv_matmul": total((part == "pv_matmul") & gemm),
        "pv_other": total((part == "pv_matmul") & ~gemm),
    }


def attention_split(points: pd.DataFrame, kernels: pd.DataFrame | None = None) -> pd.DataFrame:
    """Q9: per forward point, GPU time of the attention parts (ms per step, all layers) and the
    softmax/matmul time ratio beside the FLOP ratio. The matmul times are their GEMM kernels
    only (from the kernels' table; the point's range totals where it is missing)."""
    p = ok(points)
    p = p[p["mode"] == "forward"]
    rows = []
    for r in p.itertuples():
        d_head = r.d_model // r.num_heads
        fl = attention_flops_split(r.batch_size, r.num_heads, r.context_length, d_head)
        row = {"size": r.size, "context_length": r.context_length}
        parts = _attention_parts(kernels, r.size, r.context_length)
        for part in ATTN_PARTS:
            if parts is not None:
                row[f"{part}_ms"] = parts[part]
            else:
                row[f"{part}_ms"] = getattr(r, f"attention_{part}_kernel_ms_mean", np.nan)
        matmul_ms = row["qk_matmul_ms"] + row["pv_matmul_ms"]
        row["softmax_over_matmul_time"] = row["softmax_ms"] / matmul_ms if matmul_ms else np.nan
        row["softmax_over_matmul_flops"] = fl["softmax"] / (fl["qk_matmul"] + fl["pv_matmul"])
        row["time_vs_flops"] = row["softmax_over_matmul_time"] / row["softmax_over_matmul_flops"]
        rows.append(row)
    out = pd.DataFrame(rows)
    return sort_sizes(out, "context_length").reset_index(drop=True) if len(out) else out


def attention_matmul_units(kernels: pd.DataFrame) -> dict[str, dict]:
    """{unit: {share, kernels}} of the GEMM kernels in the attention matmul ranges of forward
    points: which units ran them (tensor cores, CUDA cores, CPU), by their names."""
    if kernels is None or kernels.empty or "phase" not in kernels:
        return {}
    k = kernels[
        (kernels["mode"] == "forward")
        & kernels["phase"].isin([f"attention.{p}" for p in MATMUL_PARTS])
        & (kernels["kernel_class"] == "gemm")
    ]
    if k.empty:
        return {}
    k = k.assign(unit=k["kernel"].map(gemm_unit))
    total = k["ms_per_step"].sum()
    out = {}
    for unit, g in k.groupby("unit"):
        names = g.groupby("kernel_short")["ms_per_step"].sum().sort_values(ascending=False)
        out[unit] = {
            "share": float(g["ms_per_step"].sum() / total) if total else float("nan"),
            "kernels": list(names.index[:2]),
        }
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["share"]))


def _matmul_sentence(units: dict[str, dict], cpu_only: bool) -> str:
    """Where the attention matmuls ran, as their kernel names say, and why softmax is slow."""
    softmax_why = (
        "softmax reads and writes the whole n×n score matrix for a few FLOPs per element (an "
        "exp each), so it is bound by memory bandwidth, not by compute."
    )
    if cpu_only or set(units) <= {"CPU"}:
        return (
            "The matmuls run in optimized BLAS at high arithmetic intensity; softmax does a "
            "few FLOPs per element of the n×n score matrix, with an exp each, and streams the "
            "whole matrix through memory."
        )
    if not units:
        return softmax_why[0].upper() + softmax_why[1:]
    parts = []
    for unit, u in units.items():
        names = ", ".join(f"`{n}`" for n in u["kernels"])
        where = {
            "tensor cores": "on tensor cores",
            "CUDA cores": "on the CUDA cores as FFMA (fp32 without TF32: no tensor cores)",
            "unknown": "in kernels whose names do not say which units they use",
        }.get(unit, f"on {unit}")
        parts.append(f"{pct(u['share'])} of their GEMM time {where} ({names})")
    return (
        "By their kernel names, the attention matmuls run "
        + "; ".join(parts)
        + ", at high arithmetic intensity either way; "
        + softmax_why
    )
