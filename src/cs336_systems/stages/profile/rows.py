"""The profile stage's rows as the report reads them: the points and their kernels, the kernel
classes' shares per phase, the top kernels, the non-GEMM kernels of forward (Q7), the GEMM shares
(Q8), the profiled forward against the harness (Q5), attention's parts and the units that ran
its matmuls (Q9); and the section's tables of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cs336_systems.core.costs import attention_flops_split
from cs336_systems.profiling.kernel_classes import (
    KERNEL_CLASSES,
    gemm_unit,
    kernel_operation,
    unique_labels,
)
from cs336_systems.reporting.analysis import load, md_table, ok, pct, sort_sizes
from cs336_systems.reporting.host_bound import host_bound, tested

# a non-GEMM kernel is "non-trivial" in forward from this share of forward GPU time on
NONTRIVIAL_SHARE = 0.02
MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}


def load_points(results_dir: Path) -> pd.DataFrame:
    return load(results_dir, "profile")


def load_kernels(results_dir: Path) -> pd.DataFrame:
    """profile_kernels.csv with `kernel_short` relabelled so that no two kernels share a name
    (a table that groups by it must not merge different kernels)."""
    k = load(results_dir, "profile_kernels")
    if len(k) and "kernel" in k:
        k = k.assign(kernel_short=k["kernel"].map(unique_labels(k["kernel"])))
    return k


def cpu_only(points: pd.DataFrame) -> bool:
    """Whether every point was profiled by torch.profiler on a CPU (operators, not kernels)."""
    return set(points.get("profiler", pd.Series(dtype=str)).dropna()) <= {"torch.profiler-cpu"}


def class_shares(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (size, context, mode, phase): GPU ms per step of each kernel class and its share."""
    if kernels.empty:
        return pd.DataFrame()
    k = kernels[kernels["phase"].isin(["step", "forward", "backward", "optimizer"])]
    g = (
        k.groupby(["size", "context_length", "mode", "phase", "kernel_class"])["ms_per_step"]
        .sum()
        .unstack("kernel_class", fill_value=0.0)
    )
    for c in KERNEL_CLASSES:
        if c not in g:
            g[c] = 0.0
    g = g[list(KERNEL_CLASSES)]
    total = g.sum(axis=1)
    shares = g.div(total.replace(0, np.nan), axis=0)
    shares["total_ms"] = total
    return shares.reset_index()


TOP_COLUMNS = [
    "size",
    "context_length",
    "kernel",
    "kernel_short",
    "kernel_class",
    "calls_per_step",
    "ms_per_step",
    "share",
]


def top_kernels(kernels: pd.DataFrame, mode: str, phases: tuple[str, ...]) -> pd.DataFrame:
    """The kernel with the most time per (size, context) in `phases` (summed) of `mode` points."""
    k = kernels[(kernels["mode"] == mode) & (kernels["phase"].isin(phases))]
    if k.empty:
        return pd.DataFrame(columns=TOP_COLUMNS)
    keys = ["size", "context_length", "kernel", "kernel_short", "kernel_class"]
    g = k.groupby(keys, as_index=False)[["calls_per_step", "ms_per_step"]].sum()
    g["share"] = g["ms_per_step"] / g.groupby(["size", "context_length"])["ms_per_step"].transform(
        "sum"
    )
    top = g.loc[g.groupby(["size", "context_length"])["ms_per_step"].idxmax(), TOP_COLUMNS]
    return sort_sizes(top, "context_length").reset_index(drop=True)


def top_kernels_forward_backward(kernels: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Forward+backward's top kernel: from forward_backward points, else from the forward and
    backward phases of training steps."""
    fb = top_kernels(kernels, "forward_backward", ("step",))
    if len(fb):
        return fb, "forward+backward"
    return top_kernels(kernels, "train_step", ("forward", "backward")), (
        "forward+backward of the training step"
    )


def nontrivial_non_gemm(kernels: pd.DataFrame, threshold: float = NONTRIVIAL_SHARE) -> pd.DataFrame:
    """Q7: non-GEMM operations at or above `threshold` of forward GPU time, over the points.
    Kernels are grouped by the operation they run (kernel_classes.kernel_operation) before the
    share is taken: softmax runs as a template per row length (`softmax_warp_forward<…, 9, …>`,
    `<…, 10, …>`) or `cunn_SoftMaxForward*`, each at only some contexts, so per kernel its
    median share over the points reads 0 where the operation takes several percent everywhere."""
    k = kernels[(kernels["mode"] == "forward") & (kernels["phase"] == "forward")]
    if k.empty:
        return pd.DataFrame()
    point = ["size", "context_length"]
    n_points = k.groupby(point).ngroups
    k = k[k["kernel_class"] != "gemm"]
    k = k.assign(operation=k["kernel"].map(kernel_operation))
    # one row per operation and point (its kernels' shares summed), then over the points; a
    # point where the operation did not run counts as a share of 0
    per_point = k.groupby(["operation", *point], as_index=False)[["share", "calls_per_step"]].sum()
    rows = []
    for op, g in per_point.groupby("operation"):
        mine = k[k["operation"] == op]
        shares = np.concatenate([g["share"].to_numpy(), np.zeros(n_points - len(g))])
        top = mine.groupby("kernel_short")["ms_per_step"].sum().sort_values(ascending=False)
        rows.append(
            {
                "operation": op,
                "class": mine["kernel_class"].mode().iloc[0],
                "median_share": float(np.median(shares)),
                "max_share": float(shares.max()),
                "points_at_or_above": int((g["share"] >= threshold).sum()),
                "of_points": n_points,
                "calls_per_step": float(g["calls_per_step"].median()),
                "kernels": len(top),
                "largest_kernel": top.index[0],
            }
        )
    g = pd.DataFrame(rows)
    if g.empty:
        return g
    g = g[g["points_at_or_above"] > 0]
    return g.sort_values(["median_share", "max_share"], ascending=False).reset_index(drop=True)


def operation_share(kernels: pd.DataFrame, operation: str) -> dict:
    """One operation's share of forward time per forward point, its kernels (every variant,
    kernel_classes.kernel_operation) summed first: {median, min, max, points, kernels}; empty
    where no forward point ran it."""
    k = kernels[(kernels["mode"] == "forward") & (kernels["phase"] == "forward")]
    if k.empty:
        return {}
    op = k["kernel"].map(kernel_operation) == operation
    per = k[op].groupby(["size", "context_length"])["share"].sum()
    per = per.reindex(k.groupby(["size", "context_length"]).size().index, fill_value=0.0)
    if not op.any():
        return {}
    return {"median": float(per.median()), "min": float(per.min()), "max": float(per.max()),
            "points": len(per), "kernels": int(k.loc[op, "kernel"].nunique())}  # fmt: skip


def gemm_shares(points: pd.DataFrame) -> pd.DataFrame:
    """Q8: GEMM share of GPU time, forward-only points vs training-step points."""
    p = ok(points)
    if p.empty or "gemm_share_step" not in p:
        return pd.DataFrame()
    t = p.pivot_table(
        index=["size", "context_length"], columns="mode", values="gemm_share_step", aggfunc="first"
    )
    t.columns.name = None
    return sort_sizes(t.reset_index(), "context_length").reset_index(drop=True)


def non_gemm_share(kernels: pd.DataFrame) -> float:
    """The median over forward points of the non-GEMM kernels' share of forward time."""
    k = kernels[(kernels["mode"] == "forward") & (kernels["phase"] == "forward")]
    if k.empty:
        return float("nan")
    per_point = k.groupby(["size", "context_length"]).apply(
        lambda g: g.loc[g["kernel_class"] != "gemm", "share"].sum(), include_groups=False
    )
    return float(per_point.median())


# ---- Q5: the profiled forward against the harness ----------------------------------------


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


def with_q1(h: pd.DataFrame, points: pd.DataFrame, bench: pd.DataFrame) -> pd.DataFrame:
    """`h` (harness_comparison) with Q1's number for each profiled forward (`q1_ms`,
    `q1_std_ms`: the benchmark stage's eager, naive-attention forward of the same size,
    context, precision and batch), `profiled_over_q1`, and `host_bound` from the one rule
    (reporting/host_bound.py) on the benchmark's fp32/bf16 pair of that point: `yes`, `no`, or
    `untested` where the benchmark has no such pair."""
    h = h.copy()
    h["q1_ms"], h["q1_std_ms"], h["host_bound"] = np.nan, np.nan, "untested"
    if not (len(h) and len(bench)):
        h["profiled_over_q1"] = np.nan
        return h
    b = ok(bench)
    b = b[(b["mode"] == "forward") & (b.get("compile", "eager") == "eager")
          & (b.get("attention", "naive") == "naive")]  # fmt: skip
    if "engine" in b:
        b = b[b["engine"].fillna("plain") == "plain"]
    p = ok(points)
    batch, prec = p["batch_size"].iloc[0], str(p["precision"].iloc[0])
    b = b[b.get("batch_size", batch) == batch]
    mine = b[b["precision"] == prec].set_index(["size", "context_length"])
    at = list(zip(h["size"], h["context_length"], strict=True))
    h["q1_ms"] = [mine["step_ms_mean"].get(k, np.nan) for k in at]
    h["q1_std_ms"] = [mine["step_ms_std"].get(k, np.nan) if "step_ms_std" in mine else np.nan
                      for k in at]  # fmt: skip
    if "peak_tflops" in b:
        fired = {(r["size"], r["context_length"]) for _, r in host_bound(b).iterrows()}
        both = {(r["size"], r["context_length"]) for _, r in tested(b).iterrows()}
        h["host_bound"] = ["yes" if k in fired else "no" if k in both else "untested" for k in at]
    h["profiled_over_q1"] = h["profiled_step_ms"] / h["q1_ms"]
    return h


# ---- Q9: attention's parts ---------------------------------------------------------------

# the parts of attention the Q9 table shows: the annotated ranges, with the 1/sqrt(d) scaling
# apart from the QK^T matmul (captures from before the `scale` range had it inside
# `qk_matmul`: its non-GEMM kernels there are the scaling) and non-GEMM work of the PV range
# (copies, casts) apart from its matmul
ATTN_PARTS = ("qk_matmul", "qk_other", "scale", "mask", "softmax", "pv_matmul", "pv_other")
MATMUL_PARTS = ("qk_matmul", "pv_matmul")


def _attention_parts(kernels: pd.DataFrame, size, ctx) -> dict[str, float] | None:
    """ms per step of each ATTN_PARTS part of one forward point, from its kernels in the
    annotated ranges: a matmul part counts only GEMM kernels, the rest of its range is its
    `_other` part; the scaling is its own range or, in older captures without one, the non-GEMM
    kernels of the QK^T range."""
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

    qk_rest = (part == "qk_matmul") & ~gemm
    own_scale = bool((part == "scale").any())
    return {
        "qk_matmul": total((part == "qk_matmul") & gemm),
        "qk_other": total(qk_rest) if own_scale else 0.0,
        "scale": total(part == "scale") if own_scale else total(qk_rest),
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


# ---- the section's tables ------------------------------------------------------------------


def harness_table(h: pd.DataFrame, kernel_word: str) -> str:
    """Q5: each profiled forward under the profiler, its range and kernels against the harness."""
    return md_table(
        h.rename(
            columns={
                "profiled_step_ms": "under profiler (ms)",
                "range_ms": "step range (ms)",
                "kernel_ms": f"{kernel_word} sum (ms)",
                "harness_ms": "harness (ms)",
                "profiled_over_harness": "profiled / harness",
                "kernel_over_harness": f"{kernel_word}s / harness",
                "harness_from": "harness measured by",
                "q1_ms": "Q1 (ms)",
                "q1_std_ms": "Q1 std (ms)",
                "profiled_over_q1": "profiled / Q1",
                "host_bound": "host-bound (rule)",
            }
        )
    )


def top_merged(fwd_top: pd.DataFrame, fb_top: pd.DataFrame) -> pd.DataFrame:
    """Q6: per (size, context), forward's top kernel (`_fwd`) beside forward+backward's (`_fb`)."""
    return fwd_top.merge(
        fb_top, on=["size", "context_length"], how="left", suffixes=("_fwd", "_fb")
    )


def top_table(merged: pd.DataFrame, fb_what: str, kernel_word: str) -> str:
    """Q6: the top kernels of forward and of forward+backward (`top_merged`)."""
    table = pd.DataFrame(
        {
            "size": merged["size"],
            "context": merged["context_length"],
            f"forward: top {kernel_word}": merged["kernel_short_fwd"],
            "class": merged["kernel_class_fwd"],
            "calls/step": merged["calls_per_step_fwd"],
            "share": merged["share_fwd"].map(pct),
            f"{fb_what}: top {kernel_word}": merged.get("kernel_short_fb"),
            "calls/step ": merged.get("calls_per_step_fb"),
            "share ": merged.get("share_fb", pd.Series(dtype=float)).map(pct),
        }
    )
    return md_table(table)


def nontrivial_table(nt: pd.DataFrame, threshold: str) -> str:
    """Q7: the first twelve non-GEMM operations at or above `threshold` of forward time, each
    with how many kernels (variants) ran it and the largest of them."""
    show = nt.head(12)
    return md_table(
        show.assign(
            median_share=show["median_share"].map(pct),
            max_share=show["max_share"].map(pct),
            calls_per_step=show["calls_per_step"].map(lambda v: f"{v:.0f}"),
        ).rename(
            columns={
                "median_share": "median share",
                "max_share": "max share",
                "points_at_or_above": f"points ≥ {threshold}",
                "of_points": "of points",
                "calls_per_step": "calls/step (median)",
                "kernels": "kernels (variants)",
                "largest_kernel": "largest kernel",
            }
        )
    )


def gemm_table(g: pd.DataFrame) -> str:
    """Q8: the GEMM share per point, forward-only against the training step."""
    return md_table(
        g.assign(**{c: g[c].map(pct) for c in g.columns if c in MODE_LABEL}).rename(
            columns=MODE_LABEL
        )
    )


def attention_columns(a: pd.DataFrame) -> list[str]:
    """Q9: the point and the attention parts that took time somewhere."""
    cols = ["size", "context_length", *(f"{p}_ms" for p in ATTN_PARTS)]
    return [c for c in cols if c in a and (a[c].fillna(0) != 0).any() or c in cols[:2]]


def attention_table(a: pd.DataFrame, cols: list[str]) -> str:
    """Q9: attention's parts (`cols`) and softmax over the matmuls, in time and in FLOPs."""
    show = a[
        [
            *cols,
            "softmax_over_matmul_time",
            "softmax_over_matmul_flops",
            "time_vs_flops",
        ]
    ]
    return md_table(show, floatfmt=3)
