"""The benchmark section's answers in words, each from the rows it names: how long a forward and
a backward take and whether the steps vary (benchmarking_script (b)), why a few warm-up steps
are not enough (c), and how bf16 autocast's speedup moves with model size
(benchmarking_mixed_precision (c)), and the speed goal's point split into forward, backward and
optimizer against fused AdamW's byte floor. A point whose time is set by the host (its bf16 step as long
as its fp32 one though its matmuls run several times faster) is named as such, not read as a
property of the GPU."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import (
    faster_or_slower,
    fmt,
    ordered_sizes,
    pct,
    plural,
    sig,
    sort_sizes,
)
from cs336_systems.stages.benchmark.rows import KEYS, MODE_LABEL, _eager_naive, backward_ratios

# a step varies little when its std is below this share of its mean
SMALL_CV = 0.05
# bf16 autocast no faster than this over fp32, where the bf16 matmul ceiling is at least
# HOST_PEAK_RATIO times the fp32 one: the step's time is not the GPU's matmul time
HOST_SPEEDUP = 1.25
HOST_PEAK_RATIO = 3.0


def _span(g: pd.DataFrame, col: str) -> str:
    first, last = g.iloc[0], g.iloc[-1]
    text = f"{fmt(first[col])} ms (`{first['size']}`)"
    return text + (f" to {fmt(last[col])} ms (`{last['size']}`)" if len(g) > 1 else "")


def pass_times(d: pd.DataFrame) -> list[str]:
    """benchmarking_script (b): forward and backward (forward+backward minus forward) per size,
    eager, naive attention, per precision and context."""
    r = backward_ratios(_eager_naive(d))
    out = []
    for (prec, ctx), g in r.groupby(["precision", "context_length"]):
        g = sort_sizes(g)
        out.append(
            f"{prec}, context {ctx}: a forward pass takes {_span(g, 'forward_ms')}, a backward "
            f"pass (forward+backward minus forward) {_span(g, 'backward_ms')}"
        )
    return out


def _point(r, precision: bool = True) -> str:
    """`small` forward bf16 eager, naive attention."""
    prec = f" {r['precision']}" if precision else ""
    return f"`{r['size']}` {MODE_LABEL[r['mode']]}{prec} {r['compile']}, {r['attention']} attention"


WHY_VARIES = {
    "cuda": "Where the GPU waits on the host (small models, short steps) the step time follows "
    "the host's scheduling, so it varies more.",
    "cpu": "On a CPU the step shares the cores with the other job the pipeline runs beside it "
    "and with the operating system, so short steps vary most.",
}
WHY_FEW = {
    "cuda": "A step or two does not finish every one-time cost: the GPU's clocks still ramp up "
    "from idle, and the allocator and the libraries' algorithm choices meet some shapes (the "
    "optimizer's, the loss's) for the first time in the first full steps",
    "cpu": "A step or two does not finish every one-time cost: the allocator's free lists and "
    "the caches still fill, and the kernels' first calls at a shape pay their dispatch",
}


def device_of(df: pd.DataFrame) -> str:
    """`cuda` or `cpu`: the rows' `device`, else their provenance's GPU count."""
    if "device" in df and df["device"].notna().any():
        return str(df["device"].dropna().iloc[0])
    gpus = pd.to_numeric(df.get("gpu_count", pd.Series(dtype=float)), errors="coerce")
    return "cuda" if gpus.fillna(0).max() > 0 else "cpu"


def variability(d: pd.DataFrame, n_steps: int, device: str = "cuda") -> str:
    """benchmarking_script (b): is the std small? The std over the measured steps as a share
    of the mean, over every point that passed the checks."""
    pts = d[d["step_ms_mean"] > 0].assign(cv=lambda x: x["step_ms_std"] / x["step_ms_mean"])
    if not len(pts):
        return ""
    high = sort_sizes(pts[pts["cv"] > SMALL_CV])
    worst = pts.loc[pts["cv"].idxmax()]
    text = (
        f"Over the {plural(len(pts), 'point')} ({n_steps} measured steps each), the std is "
        f"{pct(pts['cv'].median())} of the mean (median; at most {pct(worst['cv'])}, "
        f"{_point(worst)}): "
    )
    if not len(high):
        return text + f"small everywhere (below {pct(SMALL_CV)})."
    names = ", ".join(f"{_point(r)} ({pct(r['cv'])})" for _, r in high.head(6).iterrows())
    return (
        text + f"small at {len(pts) - len(high)} of them, above {pct(SMALL_CV)} at "
        f"{len(high)}: {names}{', …' if len(high) > 6 else ''}. "
        + WHY_VARIES.get(device, WHY_VARIES["cpu"])
    )


def host_bound(d: pd.DataFrame) -> pd.DataFrame:
    """Points whose bf16 autocast step takes about its fp32 time (speedup below HOST_SPEEDUP)
    although the bf16 matmul ceiling is HOST_PEAK_RATIO times the fp32 one or more: their time
    is the host's (kernel launches, Python), not the GPU's matmuls. Both rows' keys, with the
    speedup and the ceilings' ratio."""
    keys = [k for k in [*KEYS, "mode"] if k != "precision"]
    a = d[d["precision"] == "fp32"].set_index(keys)
    b = d[d["precision"] == "bf16"].set_index(keys)
    cols = ["step_ms_mean", "peak_tflops"]
    both = a[cols].add_suffix("_fp32").join(b[cols].add_suffix("_bf16"), how="inner")
    both["speedup"] = both["step_ms_mean_fp32"] / both["step_ms_mean_bf16"]
    both["peak_ratio"] = both["peak_tflops_bf16"] / both["peak_tflops_fp32"]
    hb = both[(both["speedup"] < HOST_SPEEDUP) & (both["peak_ratio"] >= HOST_PEAK_RATIO)]
    return hb.reset_index()


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


def host_bound_note(hb: pd.DataFrame) -> str:
    if not len(hb):
        return ""
    items = ", ".join(
        f"{_point(r, False)} (bf16 {faster_or_slower(r['speedup'])} for a {r['peak_ratio']:.1f}× "
        "faster matmul)"
        for _, r in sort_sizes(hb).head(6).iterrows()
    )
    return (
        f"Host-bound points: {items}. bf16 barely changes their step time though its matmuls "
        "run several times faster, so the host (kernel launches, the Python between them) sets "
        "their time, in every pass of the point; ratios there describe the host, not the GPU, "
        "and the backward/forward sentences leave them out."
    )


def warmup_after(g: pd.DataFrame, device: str = "cuda") -> str:
    """benchmarking_script (c): why 1 or 2 warm-up steps may still differ from 5, from the
    first measured step and the mean after each warm-up count against the longest one's."""
    if g.index.max() <= 2 or not any(k in g.index for k in (1, 2)):
        return ""
    ref = g.loc[g.index.max()]
    noise = ref["std_ms"] / max(int(ref.get("n_measured", 1)), 1) ** 0.5
    parts = []
    for k in (1, 2):
        if k not in g.index:
            continue
        r = g.loc[k]
        parts.append(
            f"after {k} warm-up step{'s' if k > 1 else ''} the first measured step is "
            f"{r['first_measured_ms'] / ref['median_ms']:.2f}× the median after "
            f"{int(g.index.max())} and the mean {r['mean_ms'] / ref['mean_ms']:.2f}× its mean"
        )
    slower = any(g.loc[k, "mean_ms"] - ref["mean_ms"] > 2 * noise for k in (1, 2) if k in g.index)
    return (
        "; ".join(parts).capitalize()
        + (
            f" (beyond twice the standard error of the {int(g.index.max())}-warm-up mean, "
            f"{fmt(noise)} ms). "
            if slower
            else f" (within twice the standard error of the mean, {fmt(noise)} ms). "
        )
        + WHY_FEW.get(device, WHY_FEW["cpu"])
        + "; with few measured steps, one slow step also moves the mean by its excess over the "
        "count." + _late_slow_step(ref, int(g.index.max()))
    )


def _late_slow_step(ref: pd.Series, k: int) -> str:
    """The longest warm-up's own first measured step, where it is slow (over 1.5× its median):
    a slow step falls after any warm-up count, which one run per count cannot separate."""
    ratio = ref["first_measured_ms"] / ref["median_ms"]
    if not ratio > 1.5:
        return ""
    return (
        f" After {k} warm-up steps the first measured step still took "
        f"{fmt(ref['first_measured_ms'])} ms, {ratio:.1f}× that run's median, and its std is "
        f"{fmt(ref['std_ms'])} ms: a slow step can fall after any warm-up count, and one run "
        "per count does not tell it from the warm-up's effect."
    )


def speedup_trend(sp: pd.DataFrame) -> str:
    """benchmarking_mixed_precision (c): how the speedup moves as the model grows, per mode
    (the median over contexts of each size)."""
    out = []
    for mode in [m for m in MODE_LABEL if m in set(sp["mode"])]:
        g = sp[sp["mode"] == mode].groupby("size")["speedup"].median()
        g = g.reindex(ordered_sizes(g.index))
        if len(g) < 2:
            continue
        steps = g.diff().dropna()
        shape = (
            "grows with every size"
            if (steps > 0).all()
            else "falls with every size"
            if (steps < 0).all()
            else "grows overall"
            if g.iloc[-1] > g.iloc[0]
            else "does not grow"
        )
        out.append(
            f"{MODE_LABEL[mode]}: {shape}, {g.iloc[0]:.2f}× at `{g.index[0]}` to "
            f"{g.iloc[-1]:.2f}× at `{g.index[-1]}`"
        )
    return "; ".join(out)


# ---- the speed goal's point -------------------------------------------------------------

# fused AdamW per fp32 parameter: reads param, grad, exp_avg, exp_avg_sq; writes all but grad
ADAMW_BYTES_PER_PARAM = 4 * 4 + 3 * 4


def goal_breakdown(d: pd.DataFrame, ceilings: pd.DataFrame) -> list[str]:
    """The speed goal's point (xl, context 512, bf16, compiled, train step), per attention, with
    the step split into forward, backward and optimizer by the step's own phase marks (where
    they are missing, by the differences of the three modes' means, said as such: runs made
    before the forward_backward mode set the gradients to None added into them, which put that
    difference below the optimizer's floor). An optimizer time below fused AdamW's byte floor
    at the measured copy bandwidth cannot be right: it is shown as suspect."""
    sel = d[
        (d["size"] == "xl")
        & (d["context_length"] == 512)
        & (d["precision"] == "bf16")
        & (d["compile"] == "compiled")
    ]
    if "engine" in sel:
        sel = sel[sel["engine"].fillna("plain") == "plain"]
    copy = (
        ceilings[(ceilings.get("kind") == "copy") & (ceilings.get("status") == "ok")]
        if len(ceilings)
        else ceilings
    )
    copy_gbps = float(copy["gbps"].iloc[0]) if len(copy) else float("nan")
    out = []
    for attention, g in sel.groupby("attention"):
        t = g.set_index("mode")["step_ms_mean"]
        if "train_step" not in t:
            continue
        row = g[g["mode"] == "train_step"].iloc[0]
        text = (
            f"attention `{attention}`: {row.step_ms_mean:.1f} ms per step, {sig(row.tflops)} "
            + (
                f"TFLOP/s, **{pct(row.mfu)} MFU** against the measured bf16 peak of the model's "
                f"path ({sig(row.peak_tflops)} TFLOP/s)"
                if row.mfu == row.mfu
                else "TFLOP/s (no MFU: this run has no bf16 ceiling through the model's path)"
            )
        )
        phases = [row.get(f"{p}_ms_mean", float("nan")) for p in ("fwd", "bwd", "opt")]
        if all(x == x for x in phases):
            fwd, bwd, opt = phases
            how = "timed between marks within the step"
        elif {"forward", "forward_backward"} <= set(t.index):
            fwd, fb = t["forward"], t["forward_backward"]
            bwd, opt = fb - fwd, row.step_ms_mean - fb
            how = "differences of the forward, forward+backward and step modes' means"
        else:
            out.append(text)
            continue
        floor = ADAMW_BYTES_PER_PARAM * row.params / (copy_gbps * 1e9) * 1e3
        text += (
            f". Of the step ({how}), forward takes {fwd:.1f} ms, backward {bwd:.1f} ms and the "
            f"optimizer {opt:.1f} ms ({100 * opt / row.step_ms_mean:.0f}% of the step, which "
            "adds no counted FLOPs)"
        )
        fb_rows = g[g["mode"] == "forward_backward"]
        if len(fb_rows) and fb_rows.iloc[0].mfu == fb_rows.iloc[0].mfu:
            text += (
                f"; forward+backward alone (its own mode) runs at {pct(fb_rows.iloc[0].mfu)} MFU"
            )
        if floor == floor:
            text += (
                f". Fused AdamW must move {ADAMW_BYTES_PER_PARAM} bytes per fp32 parameter, a "
                f"floor of {floor:.1f} ms at the measured copy bandwidth ({copy_gbps:.0f} GB/s)"
            )
            if opt < floor:
                text += (
                    f": **suspect**, the optimizer's {opt:.1f} ms is below it, so this split "
                    "cannot be right"
                )
            else:
                text += f", {floor / opt:.0%} of the optimizer's time"
        out.append(text)
    return out
