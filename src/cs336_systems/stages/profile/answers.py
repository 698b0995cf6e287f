"""The profile section's answers in words: the profiled forward against the harness's time at
every profiled point (nsys_profile (a)), and how the other kernel classes' shares move from a
forward pass to a training step ((d): "how about other kernels?"), and inside attention
(Q9) its parts (the matmuls counted by their GEMM kernels, the 1/sqrt(d) scaling on its own)
and which units ran the matmuls, by kernel name."""

from __future__ import annotations

import numpy as np
import pandas as pd

from cs336_systems.core.costs import attention_flops_split
from cs336_systems.profiling.kernel_classes import KERNEL_CLASSES, gemm_unit
from cs336_systems.reporting.analysis import ok, pct, sort_sizes

# the profiled forward "matches" the harness's within this share
MATCH = 0.10


def harness_comparison(points: pd.DataFrame, bench: pd.DataFrame) -> pd.DataFrame:
    """Q5: the forward step under the profiler vs the benchmark stage's harness timing."""
    p = ok(points)
    p = p[p["mode"] == "forward"]
    if p.empty:
        return pd.DataFrame()
    cols = {
        "size": p["size"],
        "context_length": p["context_length"],
        "profiled_step_ms": p["step_ms_mean"],
        "range_ms": p.get("step_range_ms_mean", np.nan),
        "kernel_ms": p["step_kernel_ms_mean"],
    }
    out = pd.DataFrame(cols)
    out["harness_ms"] = np.nan
    out["harness_from"] = ""
    own = pd.to_numeric(p.get("harness_ms_mean", pd.Series(np.nan, index=p.index)), errors="coerce")
    if own.notna().any():
        # the profile job timed its forward as the harness does, before the capture
        out["harness_ms"] = own.to_numpy()
        out["harness_from"] = np.where(own.notna(), "this job", "")
    if len(bench) and out["harness_ms"].isna().any():
        b = ok(bench)
        b = b[
            (b["mode"] == "forward")
            & (b.get("compile", "eager") == "eager")
            & (b.get("attention", "naive") == "naive")
            & (b.get("batch_size", p["batch_size"].iloc[0]) == p["batch_size"].iloc[0])
        ]
        prec = str(p["precision"].iloc[0])
        b = b[b["precision"] == prec]
        h = b.set_index(["size", "context_length"])["step_ms_mean"]
        from_bench = [
            h.get((s, c), np.nan) for s, c in zip(out["size"], out["context_length"], strict=True)
        ]
        missing = out["harness_ms"].isna().to_numpy()
        out.loc[missing, "harness_ms"] = np.asarray(from_bench)[missing]
        out.loc[missing & out["harness_ms"].notna().to_numpy(), "harness_from"] = "benchmark"
    out["profiled_over_harness"] = out["profiled_step_ms"] / out["harness_ms"]
    out["kernel_over_harness"] = out["kernel_ms"] / out["harness_ms"]
    return sort_sizes(out, "context_length").reset_index(drop=True)


def harness_sentence(h: pd.DataFrame, kernel_word: str) -> tuple[str, dict]:
    """(the sentence, a coverage note where some point has no harness time)."""
    cov: dict = {}
    hh = h.dropna(subset=["harness_ms"])
    if len(hh):
        r = hh["profiled_over_harness"]
        close = (r - 1).abs() <= MATCH
        where = f"every one of the {len(h)}" if len(hh) == len(h) else f"{len(hh)} of the {len(h)}"
        own = (hh["harness_from"] == "this job").all()
        sentence = (
            f"At {where} profiled forward point{'s' if len(h) > 1 else ''} the harness's time "
            + (
                "was measured by the profile job itself, before its capture (the benchmark's "
                "method and step counts)"
                if own
                else "comes from the benchmark stage's same point"
            )
            + f": the step timed under the profiler takes {r.median():.2f}× it (median; "
            f"{r.min():.2f}–{r.max():.2f}×), within ±{MATCH:.0%} at {int(close.sum())} of "
            f"{len(hh)}, and the summed {kernel_word} time is "
            f"{hh['kernel_over_harness'].median():.2f}× it ("
            f"{hh['kernel_over_harness'].min():.2f}–{hh['kernel_over_harness'].max():.2f}×). "
            + (
                "So the profiled forward matches the Python timing"
                if close.all()
                else "So the profiled forward does not match the Python timing everywhere"
            )
            + f": the profiler's own work (recording every {kernel_word} and range) "
            "lengthens the profiled step, while the kernels alone leave out the host's gaps "
            "between launches."
        )
        if len(hh) < len(h):
            cov = {
                "nsys_profile.a": {
                    "status": "partly",
                    "why": f"{len(h) - len(hh)} profiled forward point(s) have no harness time",
                    "how": "the profile stage's `harness` block (config/stages/profile.yaml)",
                }
            }
    else:
        sentence = (
            "Neither the profile job (its `harness` block) nor the benchmark stage timed these "
            "forward points outside the profiler, so only the profiled times are shown."
        )
        cov = {
            "nsys_profile.a": {
                "status": "partly",
                "why": "no harness time at the profiled points",
                "how": "the profile stage's `harness` block (config/stages/profile.yaml)",
            }
        }

    return sentence, cov


def other_kernels(kernels: pd.DataFrame, unit: str) -> str:
    """Each kernel class but GEMM: its median share of a forward pass's and of a training
    step's time (the whole step's kernels), and which way it moves."""
    k = kernels[(kernels["phase"] == "step") & kernels["mode"].isin(["forward", "train_step"])]
    if k.empty:
        return ""
    per = k.groupby(["size", "context_length", "mode", "kernel_class"])["ms_per_step"].sum()
    share = per / per.groupby(["size", "context_length", "mode"]).transform("sum")
    med = share.groupby(["mode", "kernel_class"]).median().unstack("mode").fillna(0.0)
    if not {"forward", "train_step"} <= set(med.columns):
        return ""
    parts = []
    for cls in [c for c in KERNEL_CLASSES if c != "gemm" and c in med.index]:
        f, t = med.loc[cls, "forward"], med.loc[cls, "train_step"]
        if max(f, t) < 0.005:
            continue
        move = "rises" if t > f * 1.1 else "falls" if t < f / 1.1 else "stays"
        parts.append(f"{cls} {pct(f)} → {pct(t)} ({move})")
    if not parts:
        return ""
    return (
        f"The other kernel classes' median shares of {unit}, forward → training step: "
        + "; ".join(parts)
        + ". Backward brings the elementwise and reduction gradients of every norm, activation "
        "and softmax, and the optimizer adds its own elementwise class over every parameter."
    )


# ---- Q9: attention's parts -------------------------------------------------------------

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
