"""The attention section's figures: forward and backward time, memory before backward (measured
and counted) and torch.compile's speed-up over the length, one colour per head dim (analysis.py
plots them)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from cs336_systems.reporting.analysis import empty_figure, load, save, status_counts
from cs336_systems.stages.attention.rows import points, speedups

NAMES = ["time", "memory", "compile"]


def _log2_x(ax, values) -> None:
    """Base-2 log x axis labelled at the measured lengths only."""
    from matplotlib.ticker import NullFormatter

    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.xaxis.set_minor_formatter(NullFormatter())


def _per_d_colors(ds):
    cmap = plt.get_cmap("viridis")
    ds = sorted(ds)
    return {d: cmap(i / max(len(ds) - 1, 1)) for i, d in enumerate(ds)}


def _no_time_note(ax, df: pd.DataFrame) -> None:
    """In place of lines: no point has this pass's time, with the rows' statuses counted."""
    counts = status_counts(df)
    text = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    ax.text(0.5, 0.5, f"no point timed\n({text})", ha="center", va="center",
            transform=ax.transAxes, fontsize=9, color="0.4")  # fmt: skip


def _time_figure(df: pd.DataFrame, colors: dict, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, col, title in zip(
        axes, ["fwd_ms_mean", "bwd_ms_mean"], ["forward", "backward"], strict=True
    ):
        timed = df[df[col].notna()] if col in df else df.iloc[:0]
        if timed.empty:
            _no_time_note(ax, df)
        for (impl, d), g in df.groupby(["impl", "d_head"]):
            good = timed[(timed["impl"] == impl) & (timed["d_head"] == d)]
            if good.empty:
                continue
            style = "-" if impl == "naive_eager" else "--"
            ax.plot(good["seq_len"], good[col], style, marker="o", color=colors[d],
                    label=f"{impl.removeprefix('naive_')} d={d}")  # fmt: skip
            oom = g[g["status"] == "oom"]
            if len(oom):
                ax.scatter(
                    oom["seq_len"], [good[col].max()] * len(oom), marker="x", s=80, color=colors[d]
                )
        ax.set(xlabel="sequence length n", title=f"{title} (x: OOM)")
        if not timed.empty:
            ax.set_yscale("log")
        _log2_x(ax, df["seq_len"])
    axes[0].set_ylabel("ms per pass (mean)")
    if axes[1].get_legend_handles_labels()[1]:
        axes[1].legend(fontsize=7, ncol=2)
    return save(fig, path)


def _memory_figure(df: pd.DataFrame, colors: dict, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    eager = df[df["impl"] == "naive_eager"]
    have_mem = "mem_before_backward_mb" in eager and eager["mem_before_backward_mb"].notna().any()
    for d, g in eager.groupby("d_head"):
        if have_mem:
            good = g[g["mem_before_backward_mb"].notna()]
            ax.plot(
                good["seq_len"],
                good["mem_before_backward_mb"],
                "-o",
                color=colors[d],
                label=f"measured d={d}",
            )
        ax.plot(
            g["seq_len"],
            g["expected_before_backward_mb"],
            ":",
            color=colors[d],
            label=f"counted d={d}",
        )
        oom = g[g["status"] == "oom"]
        if len(oom):
            ax.scatter(
                oom["seq_len"],
                oom["expected_before_backward_mb"],
                marker="x",
                s=80,
                color=colors[d],
            )
    if "device_memory_mb" in df and df["device_memory_mb"].notna().any():
        ax.axhline(df["device_memory_mb"].max(), color="red", lw=0.8, label="device memory")
    ax.set(
        yscale="log",
        xlabel="sequence length n",
        ylabel="MiB",
        title="Memory in use before backward (eager; x: OOM)",
    )
    _log2_x(ax, df["seq_len"])
    ax.legend(fontsize=7)
    return save(fig, path)


def _compile_figure(sp: pd.DataFrame, colors: dict, path: Path) -> Path:
    if len(sp) == 0:
        return empty_figure(path, "attention: no point ran both eager and compiled")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for d, g in sp.groupby("d_head"):
        ax.plot(g["seq_len"], g["fwd_speedup"], "-o", color=colors[d], label=f"forward d={d}")
        ax.plot(g["seq_len"], g["bwd_speedup"], "--s", color=colors[d], label=f"backward d={d}")
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set(
        xlabel="sequence length n",
        ylabel="eager time / compiled time",
        title="torch.compile speedup on naive attention",
    )
    _log2_x(ax, sp["seq_len"])
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "attention")
    fig_dir = Path(fig_dir)
    if len(df) == 0:
        return [empty_figure(fig_dir / f"attention_{n}.png", "attention: no data") for n in NAMES]
    df = points(df)
    colors = _per_d_colors(df["d_head"].unique())
    return [
        _time_figure(df, colors, fig_dir / "attention_time.png"),
        _memory_figure(df, colors, fig_dir / "attention_memory.png"),
        _compile_figure(speedups(df), colors, fig_dir / "attention_compile.png"),
    ]
