"""The ddp section's figures (analysis.py plots them): where a step's time goes per variant, the
bucketed runs' step time against the overhead model, and memory with and without
optimizer-state sharding."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.core.costs import MiB
from cs336_systems.reporting.analysis import empty_figure, load, ok, ran, save, stacked_bars
from cs336_systems.reporting.timelines import Panel, panel_from_rows
from cs336_systems.reporting.timelines import draw as draw_timelines
from cs336_systems.stages.ddp.rows import (
    comm_fits,
    one,
    peaks_reset,
    run_label,
    usable,
    variant_runs,
)

PARTS = [("fwd_bwd", "forward+backward"), ("comm", "gradient sync"), ("opt", "optimizer step")]


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "ddp")
    allreduce = load(results_dir, "allreduce")
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"ddp_{n}.png" for n in ("variants", "buckets", "memory")}
    d = ok(variant_runs(df)) if len(df) else pd.DataFrame()
    return [
        _variants(d, paths["variants"]),
        _buckets(df, d, allreduce, paths["buckets"]),
        _memory(df, paths["memory"]),
        # ddp_overlap (b): the profiled steps on a timeline (their own files)
        _timeline(results_dir, fig_dir / "ddp_timeline.png"),
    ]


def _variants(d: pd.DataFrame, path: Path) -> Path:
    """Step time split into forward+backward, sync after backward and optimizer step."""
    if len(d) == 0:
        return empty_figure(path, "no successful DDP runs")
    labels = [
        run_label(r.variant, r.bucket_size_mb if r.variant == "bucketed" else None)
        for r in d.itertuples()
    ]
    # horizontal bars: the runs' labels, read side by side, never collide
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.4 * len(d)))
    parts = [(f"{col}_ms_mean", name) for col, name in PARTS]
    stacked_bars(ax, labels, d, parts, horizontal=True)
    ax.errorbar(d["step_ms_mean"], labels, xerr=d["step_ms_std"], fmt="k.", label="step (total)")
    ax.set_xlabel("ms per training step (slowest rank)")
    ax.set_title("DDP variants: where a step's time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)


def _buckets(df: pd.DataFrame, d: pd.DataFrame, allreduce: pd.DataFrame, path: Path) -> Path:
    """Bucket size: measured step time against the overhead model."""
    b = d[d["variant"] == "bucketed"].sort_values("bucket_size_mb") if len(d) else d
    if len(b) == 0:
        tried = set(ran(variant_runs(df))["variant"]) if len(df) else set()
        why = "every one failed a sanity check" if "bucketed" in tried else "none succeeded"
        return empty_figure(path, f"bucketed runs: {why}")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.errorbar(
        b["bucket_size_mb"], b["step_ms_mean"], yerr=b["step_ms_std"], marker="o", label="measured"
    )
    base = one(d, "baseline")
    fits = usable(comm_fits(df, allreduce))
    if base is not None:
        ax.axhline(base.step_ms_mean, color="gray", ls=":", label="compute only")
        s = float(b["grad_mb"].iloc[0]) * MiB
        sizes = np.geomspace(b["bucket_size_mb"].min() / 4, b["bucket_size_mb"].max(), 100)
        for (name, f), style in zip(fits.items(), ("--", "-."), strict=False):
            n_b = np.maximum(1.0, s / (sizes * MiB))
            pred = base.step_ms_mean + 1e3 * (s / (n_b * f["w"]) + n_b * f["o"])
            ax.plot(sizes, pred, style, label=f"model ({name})")
    others = d[d["variant"].isin(["naive", "flat", "overlap"])]
    for r, color in zip(others.itertuples(), ("C3", "C4", "C5"), strict=False):
        ax.axhline(
            r.step_ms_mean, color=color, lw=0.9, ls=(0, (5, 3)), label=run_label(r.variant, None)
        )
    ax.set_xscale("log")
    ax.set_xlabel("bucket size (MiB)")
    ax.set_ylabel("ms per training step")
    ax.set_title("Bucketed DDP: step time vs bucket size")
    ax.legend(fontsize=7)
    return save(fig, path)


def _memory(df: pd.DataFrame, path: Path) -> Path:
    """Memory with and without optimizer-state sharding: tensors held and peaks."""
    m = ok(df[df["kind"] == "sharding"]) if len(df) and "kind" in df else pd.DataFrame()
    if len(m) == 0:
        return empty_figure(path, "no successful sharding runs")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(m["variant"])
    held = (
        ("params_mb", "parameters"),
        ("grads_mb", "gradients"),
        ("optimizer_state_mb", "optimizer state"),
    )
    stacked_bars(axes[0], names, m, held, fill=0)
    axes[0].set_ylabel("MiB per rank")
    axes[0].set_title("tensors held per rank")
    axes[0].legend(fontsize=8)
    # each peak since the previous point (measure.py resets the counter at each)
    peaks = [
        ("mem_init_peak_mb", "up to\nmodel init"),
        ("mem_before_step_peak_mb", "forward+\nbackward"),
        ("mem_after_step_peak_mb", "optimizer\nstep"),
    ]
    if m["mem_after_step_peak_mb"].notna().any():
        x = np.arange(len(peaks))
        for i, r in enumerate(m.itertuples()):
            axes[1].bar(x + 0.4 * i, [getattr(r, c) for c, _ in peaks], 0.4, label=r.variant)
        axes[1].set_xticks(x + 0.2, [label for _, label in peaks])
        axes[1].set_ylabel("peak allocated MiB (max over ranks)")
        axes[1].legend(fontsize=8)
    else:
        axes[1].axis("off")
        axes[1].text(0.5, 0.5, "peak memory needs a GPU (the CUDA allocator's)", ha="center")
    axes[1].set_title(
        "peak memory, reset at each point" if peaks_reset(m) else "peak memory since the start"
    )
    return save(fig, path)


# ---- ddp_overlap (b): naive beside overlapped, one profiled step each --------------------------

TIMELINE_RUNS = (
    ("naive", "naive DDP (every all-reduce after backward)"),
    ("overlap", "overlapped DDP (each gradient's all-reduce launched as it is ready)"),
)


def timeline_panels(results_dir: Path) -> list[Panel]:
    """The profiled steps of naive and overlapped DDP (measure.py keeps their windows)."""
    df = load(results_dir, "ddp")
    runs = variant_runs(df)
    if "variant" not in runs:
        runs = pd.DataFrame(columns=["variant"])
    return [
        panel_from_rows(results_dir, "ddp", runs[runs["variant"] == v], title)
        for v, title in TIMELINE_RUNS
    ]


def _timeline(results_dir: Path, path: Path) -> Path:
    return draw_timelines(
        timeline_panels(results_dir), path, "DDP: one training step, naive beside overlapped"
    )
