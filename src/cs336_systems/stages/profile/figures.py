"""The profile stage's figures: the kernel classes' shares per phase, the GEMM share against
context length, and softmax over the attention matmuls in time against FLOPs."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.profiling.kernel_classes import KERNEL_CLASSES
from cs336_systems.reporting.analysis import SIZE_ORDER, empty_figure, ok, save
from cs336_systems.stages.profile.rows import (
    MODE_LABEL,
    attention_split,
    class_shares,
    cpu_only,
    gemm_shares,
    load_kernels,
    load_points,
)

CLASS_COLORS = {
    "gemm": "#1f77b4",
    "attention": "#9467bd",
    "elementwise": "#ff7f0e",
    "reduction": "#2ca02c",
    "optimizer": "#d62728",
    "other": "#7f7f7f",
}


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    points, kernels = load_points(results_dir), load_kernels(results_dir)
    fig_dir = Path(fig_dir)
    paths = {n: fig_dir / f"profile_{n}.png" for n in ("kernel_share", "gemm_share", "attention")}
    if points.empty or ok(points).empty or kernels.empty:
        return [empty_figure(p, "no successful profile points") for p in paths.values()]
    unit = "CPU operator time" if cpu_only(points) else "GPU kernel time"
    return [
        _kernel_share_figure(kernels, unit, paths["kernel_share"]),
        _gemm_share_figure(points, unit, paths["gemm_share"]),
        _attention_figure(points, kernels, paths["attention"]),
    ]


def _kernel_share_figure(kernels: pd.DataFrame, unit: str, path: Path) -> Path:
    """Kernel-class shares per phase: one panel per size, at its largest profiled context."""
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
    return save(fig, path)


def _gemm_share_figure(points: pd.DataFrame, unit: str, path: Path) -> Path:
    """GEMM share against context length, forward-only (solid) and training step (dashed)."""
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
    return save(fig, path)


def _attention_figure(points: pd.DataFrame, kernels: pd.DataFrame, path: Path) -> Path:
    """Softmax / matmul: time ratio against FLOP ratio, per size over context length."""
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
    return save(fig, path)
