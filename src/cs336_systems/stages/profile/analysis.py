"""Report context and figures for the `profile` stage (questions 5-9)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.core.costs import SOFTMAX_FLOPS_PER_ELEMENT
from cs336_systems.profiling.kernel_classes import KERNEL_CLASSES, unique_labels
from cs336_systems.reporting.analysis import (
    SIZE_ORDER,
    empty_figure,
    failed_points,
    load,
    md_table,
    ok,
    pct,
    plot_main,
    save,
    sort_sizes,
)
from cs336_systems.stages.profile import answers
from cs336_systems.stages.profile.answers import (
    ATTN_PARTS,
    _matmul_sentence,
    attention_matmul_units,
    attention_split,
    harness_comparison,
)

# a non-GEMM kernel is "non-trivial" in forward from this share of forward GPU time on
NONTRIVIAL_SHARE = 0.02
MODE_LABEL = {
    "forward": "forward",
    "forward_backward": "forward+backward",
    "train_step": "train step",
}
CLASS_COLORS = {
    "gemm": "#1f77b4",
    "attention": "#9467bd",
    "elementwise": "#ff7f0e",
    "reduction": "#2ca02c",
    "optimizer": "#d62728",
    "other": "#7f7f7f",
}


def _points(results_dir: Path) -> pd.DataFrame:
    return load(results_dir, "profile")


def _kernels(results_dir: Path) -> pd.DataFrame:
    """profile_kernels.csv with `kernel_short` relabelled so that no two kernels share a name
    (a table that groups by it must not merge different kernels)."""
    k = load(results_dir, "profile_kernels")
    if len(k) and "kernel" in k:
        k = k.assign(kernel_short=k["kernel"].map(unique_labels(k["kernel"])))
    return k


def _label(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(mode_label=df["mode"].map(MODE_LABEL))


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


_TOP_COLUMNS = [
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
        return pd.DataFrame(columns=_TOP_COLUMNS)
    keys = ["size", "context_length", "kernel", "kernel_short", "kernel_class"]
    g = k.groupby(keys, as_index=False)[["calls_per_step", "ms_per_step"]].sum()
    g["share"] = g["ms_per_step"] / g.groupby(["size", "context_length"])["ms_per_step"].transform(
        "sum"
    )
    top = g.loc[g.groupby(["size", "context_length"])["ms_per_step"].idxmax(), _TOP_COLUMNS]
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
    """Q7: non-GEMM kernels at or above `threshold` of forward GPU time, over the points."""
    k = kernels[(kernels["mode"] == "forward") & (kernels["phase"] == "forward")]
    if k.empty:
        return pd.DataFrame()
    point = ["size", "context_length"]
    n_points = k.groupby(point).ngroups
    k = k[k["kernel_class"] != "gemm"]
    # one row per kernel (its full name) and point, then over the points; a point where the
    # kernel did not run counts as a share of 0
    per_point = k.groupby(["kernel", "kernel_short", "kernel_class", *point], as_index=False)[
        ["share", "calls_per_step"]
    ].sum()
    rows = []
    for (kernel, short, cls), g in per_point.groupby(["kernel", "kernel_short", "kernel_class"]):
        shares = np.concatenate([g["share"].to_numpy(), np.zeros(n_points - len(g))])
        rows.append(
            {
                "kernel": short,
                "class": cls,
                "median_share": float(np.median(shares)),
                "max_share": float(shares.max()),
                "points_at_or_above": int((g["share"] >= threshold).sum()),
                "of_points": n_points,
                "calls_per_step": float(g["calls_per_step"].median()),
                "_full": kernel,
            }
        )
    g = pd.DataFrame(rows)
    if g.empty:
        return g
    g = g[g["points_at_or_above"] > 0]
    return g.sort_values(["median_share", "max_share"], ascending=False).reset_index(drop=True)


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


# ---------------------------------------------------------------------------------------------


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    points, kernels = _points(results_dir), _kernels(results_dir)
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"profile_{n}.png" for n in ("kernel_share", "gemm_share", "attention")}
    if points.empty or ok(points).empty or kernels.empty:
        return [empty_figure(p, "no successful profile points") for p in paths.values()]
    out = []
    unit = "CPU operator time" if _cpu_only(points) else "GPU kernel time"

    # kernel-class shares per phase: one panel per size, at its largest profiled context
    shares = class_shares(kernels)
    sizes = [s for s in SIZE_ORDER if s in set(shares["size"])]
    fig, axes = plt.subplots(
        1,
        len(sizes) + 1,
        figsize=(3.3 * len(sizes) + 1.4, 3.8),
        squeeze=False,
        gridspec_kw={"width_ratios": [*[3.3] * len(sizes), 1.4]},
    )
    for ax, size in zip(axes[0][:-1], sizes, strict=True):
        sh = shares[shares["size"] == size]
        ctx = sh["context_length"].max()
        sh = sh[sh["context_length"] == ctx]
        bars = []
        for mode, phase, label in (
            ("forward", "forward", "fwd-only"),
            ("train_step", "forward", "train: fwd"),
            ("train_step", "backward", "train: bwd"),
            ("train_step", "optimizer", "train: opt"),
        ):
            r = sh[(sh["mode"] == mode) & (sh["phase"] == phase)]
            if len(r):
                bars.append((label, r.iloc[0]))
        bottom = np.zeros(len(bars))
        for cls in KERNEL_CLASSES:
            vals = np.array([100 * float(b[cls]) for _, b in bars])
            ax.bar(
                [lab for lab, _ in bars], vals, bottom=bottom, color=CLASS_COLORS[cls], label=cls
            )
            bottom += vals
        for i, (_, b) in enumerate(bars):
            ax.text(i, 101, f"{b['total_ms']:.3g} ms", ha="center", fontsize=7)
        ax.set_ylim(0, 110)
        ax.set_title(f"{size}, context {ctx}", fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
    axes[0][0].set_ylabel(f"share of {unit} (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].axis("off")
    axes[0][-1].legend(handles[::-1], labels[::-1], fontsize=8, loc="center left")
    out.append(save(fig, paths["kernel_share"]))

    # GEMM share vs context length
    g = gemm_shares(points)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for size in [s for s in SIZE_ORDER if s in set(g.get("size", []))]:
        gs = g[g["size"] == size].sort_values("context_length")
        color = None
        for mode, ls in (("forward", "-"), ("train_step", "--")):
            if mode in gs:
                line = ax.plot(
                    gs["context_length"],
                    100 * gs[mode],
                    ls=ls,
                    marker="o",
                    color=color,
                    label=f"{size} {MODE_LABEL[mode]}",
                )
                color = line[0].get_color()
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length")
    ax.set_ylabel(f"GEMM share of {unit} (%)")
    ax.legend(fontsize=7, ncol=2)
    out.append(save(fig, paths["gemm_share"]))

    # softmax / matmul: time ratio against FLOP ratio
    a = attention_split(points, kernels)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for size in [s for s in SIZE_ORDER if s in set(a.get("size", []))]:
        s_ = a[a["size"] == size].sort_values("context_length")
        line = ax.plot(
            s_["context_length"], s_["softmax_over_matmul_time"], marker="o", label=f"{size} time"
        )
        ax.plot(
            s_["context_length"],
            s_["softmax_over_matmul_flops"],
            ls=":",
            color=line[0].get_color(),
            label=f"{size} FLOPs",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length")
    ax.set_ylabel("softmax / (QKᵀ + PV matmuls)")
    ax.set_title("attention in forward: time ratio (solid) vs FLOP ratio (dotted)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    out.append(save(fig, paths["attention"]))
    return out


def _cpu_only(points: pd.DataFrame) -> bool:
    return set(points.get("profiler", pd.Series(dtype=str)).dropna()) <= {"torch.profiler-cpu"}


def _fmt_ms(x: float) -> str:
    return "–" if pd.isna(x) else f"{x:.3g} ms"


def probe_sentences(probe: pd.DataFrame) -> list[str]:
    """Per size: the contexts the probe tried with their status, its result and the grid."""
    out = []
    if probe.empty or "context_length" not in probe:
        return out
    for size, g in probe.groupby("size", sort=False):
        g = g.dropna(subset=["context_length"]).sort_values("context_length")
        if g.empty:
            continue
        tried = ", ".join(f"{int(r['context_length'])} {r['status']}" for _, r in g.iterrows())
        r = g.iloc[-1]
        largest = r["largest_fitting"]
        found = f"the largest that fits is {int(largest)}" if pd.notna(largest) else "none fits"
        why = "the cap" if r["stopped_by"] == "cap" else "the first failure"
        out.append(
            f"{size}: one {r['probe_mode']} step per context, doubling from "
            f"{int(r['probe_start'])} up to {int(r['probe_cap'])} ({tried}); {found} (stopped by "
            f"{why}), so the profiled contexts are {r['grid_contexts']}."
        )
    return out


def context(results_dir: Path) -> dict:
    points, kernels = _points(results_dir), _kernels(results_dir)
    s: dict = {"available": len(points) > 0}
    if not s["available"]:
        return s
    bench = load(results_dir, "benchmark")
    good = ok(points)
    s["n_points"], s["n_ok"] = len(points), len(good)
    s["statuses"] = points["status"].value_counts().to_dict()
    s["failed_table"] = (
        md_table(sort_sizes(failed_points(points, ["size", "context_length", "mode"])))
        if len(good) < len(points)
        else ""
    )
    s["profilers"] = sorted(points["profiler"].dropna().unique())
    notes = points.get("profiler_note", pd.Series(dtype=str)).dropna().astype(str)
    s["profiler_notes"] = sorted({n for n in notes if n and n != "nan"})
    s["cpu_only"] = _cpu_only(points)
    s["unit"] = "CPU operator self time" if s["cpu_only"] else "GPU kernel time"
    s["kernel_word"] = "operator" if s["cpu_only"] else "kernel"
    first = points.iloc[0]
    s["precision"] = first["precision"]
    s["batch_size"] = int(first["batch_size"])
    s["warmup_steps"] = int(first["warmup_steps"])
    s["measure_steps"] = int(first["measure_steps"])
    s["probe_sentences"] = probe_sentences(load(results_dir, "profile_probe"))
    if good.empty or kernels.empty:
        s["available"] = False
        return s

    # Q5
    h = harness_comparison(points, bench)
    s["harness_table"] = md_table(
        h.rename(
            columns={
                "profiled_step_ms": "under profiler (ms)",
                "range_ms": "step range (ms)",
                "kernel_ms": f"{s['kernel_word']} sum (ms)",
                "harness_ms": "harness (ms)",
                "profiled_over_harness": "profiled / harness",
                "kernel_over_harness": f"{s['kernel_word']}s / harness",
                "harness_from": "harness measured by",
            }
        )
    )
    s["harness_sentence"], cov = answers.harness_sentence(h, s["kernel_word"])
    if cov:
        s["coverage"] = cov

    # Q6
    fwd_top = top_kernels(kernels, "forward", ("forward",))
    fb_top, fb_what = top_kernels_forward_backward(kernels)
    if len(fwd_top):
        merged = fwd_top.merge(
            fb_top, on=["size", "context_length"], how="left", suffixes=("_fwd", "_fb")
        )
        table = pd.DataFrame(
            {
                "size": merged["size"],
                "context": merged["context_length"],
                f"forward: top {s['kernel_word']}": merged["kernel_short_fwd"],
                "class": merged["kernel_class_fwd"],
                "calls/step": merged["calls_per_step_fwd"],
                "share": merged["share_fwd"].map(pct),
                f"{fb_what}: top {s['kernel_word']}": merged.get("kernel_short_fb"),
                "calls/step ": merged.get("calls_per_step_fb"),
                "share ": merged.get("share_fb", pd.Series(dtype=float)).map(pct),
            }
        )
        s["top_table"] = md_table(table)
        same = (merged["kernel_fwd"] == merged.get("kernel_fb")).sum()
        n_fb = merged.get("kernel_fb", pd.Series(dtype=str)).notna().sum()
        classes = fwd_top["kernel_class"].value_counts()
        big = fwd_top.iloc[-1]
        s["top_sentence"] = (
            f"The {s['kernel_word']} with the most {s['unit']} in forward is of class "
            f"`{classes.index[0]}` in {classes.iloc[0]} of {len(fwd_top)} points; for "
            f"{big['size']} at context {big.context_length} it is `{big.kernel_short}` "
            f"({big.calls_per_step:.0f} calls per forward, {pct(big.share)} of forward time). "
            + (
                f"The same {s['kernel_word']} tops {fb_what} in {same} of {n_fb} points."
                if n_fb
                else "No forward+backward or training-step points were profiled."
            )
        )
    # Q7
    nt = nontrivial_non_gemm(kernels)
    s["nontrivial_threshold"] = pct(NONTRIVIAL_SHARE)
    if len(nt):
        show = nt.head(12).drop(columns="_full")
        s["nontrivial_table"] = md_table(
            show.assign(
                median_share=show["median_share"].map(pct),
                max_share=show["max_share"].map(pct),
                calls_per_step=show["calls_per_step"].map(lambda v: f"{v:.0f}"),
            ).rename(
                columns={
                    "median_share": "median share",
                    "max_share": "max share",
                    "points_at_or_above": f"points ≥ {s['nontrivial_threshold']}",
                    "of_points": "of points",
                    "calls_per_step": "calls/step (median)",
                }
            )
        )
        share_non_gemm = _non_gemm_share(kernels)
        s["nontrivial_sentence"] = (
            f"{len(nt)} distinct non-GEMM {s['kernel_word']}s reach {s['nontrivial_threshold']} "
            f"of forward time in at least one of the {int(nt['of_points'].iloc[0])} points; "
            f"together non-GEMM work is {pct(share_non_gemm)} of forward "
            f"{s['unit']} (median over points). The largest is `{nt.iloc[0]['kernel']}` "
            f"({nt.iloc[0]['class']}, median {pct(nt.iloc[0]['median_share'])}, at or above "
            f"{s['nontrivial_threshold']} in {nt.iloc[0]['points_at_or_above']} of "
            f"{nt.iloc[0]['of_points']} points)."
        )
    # Q8
    g = gemm_shares(points)
    if len(g) and {"forward", "train_step"} <= set(g.columns):
        s["gemm_table"] = md_table(
            g.assign(**{c: g[c].map(pct) for c in g.columns if c in MODE_LABEL}).rename(
                columns=MODE_LABEL
            )
        )
        both = g.dropna(subset=["forward", "train_step"])
        if len(both):
            s["other_kernels_sentence"] = answers.other_kernels(kernels, s["unit"])
            s["gemm_sentence"] = (
                f"GEMMs take a median {pct(both['forward'].median())} of {s['unit']} in a "
                f"forward pass and {pct(both['train_step'].median())} in a full training step "
                f"({len(both)} size/context points; forward-only above training step in "
                f"{int((both['forward'] > both['train_step']).sum())} of them)."
            )
    # Q9
    a = attention_split(points, kernels)
    if len(a) and a["softmax_ms"].notna().any():
        cols = ["size", "context_length", *(f"{p}_ms" for p in ATTN_PARTS)]
        cols = [c for c in cols if c in a and (a[c].fillna(0) != 0).any() or c in cols[:2]]
        show = a[
            [
                *cols,
                "softmax_over_matmul_time",
                "softmax_over_matmul_flops",
                "time_vs_flops",
            ]
        ]
        s["attention_table"] = md_table(show, floatfmt=3)
        s["attention_scale_note"] = (
            "The 1/√d scaling of the scores is its own part (`scale`), not counted as matmul "
            "time: in captures whose annotated attention put it inside the QKᵀ range it is the "
            "non-GEMM work of that range."
            if "scale_ms" in cols
            else ""
        )
        s["matmul_units"] = attention_matmul_units(kernels)
        ratio = float(a["time_vs_flops"].median())
        per_flop = (
            f"per FLOP, softmax is {ratio:.0f}× slower"
            if ratio >= 1.5
            else (
                f"per FLOP, softmax is about as fast as the matmuls ({ratio:.2f}×)"
                if ratio > 0.67
                else f"per FLOP, softmax is faster than the matmuls ({ratio:.2f}×)"
            )
        )
        s["attention_sentence"] = (
            f"Inside forward attention, softmax takes {a['softmax_over_matmul_time'].median():.2f}× "
            f"the time of the two matmuls (median over {len(a)} points) while it has only "
            f"{a['softmax_over_matmul_flops'].median():.3f}× their FLOPs "
            f"({SOFTMAX_FLOPS_PER_ELEMENT} FLOPs per score against 4·d_head): {per_flop}. "
            + (
                _matmul_sentence(s["matmul_units"], s["cpu_only"])
                if ratio >= 1.5
                else "At these sizes the matmuls are far from their peak too (small matrices: "
                "call overheads and low arithmetic intensity), so the FLOP ratio does not "
                "predict the time ratio."
            )
        )
    return s


def _non_gemm_share(kernels: pd.DataFrame) -> float:
    k = kernels[(kernels["mode"] == "forward") & (kernels["phase"] == "forward")]
    if k.empty:
        return float("nan")
    per_point = k.groupby(["size", "context_length"]).apply(
        lambda g: g.loc[g["kernel_class"] != "gemm", "share"].sum(), include_groups=False
    )
    return float(per_point.median())


if __name__ == "__main__":
    plot_main(plot)
