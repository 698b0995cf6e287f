"""The flash section's figures: latency and TFLOP/s of every implementation per dtype and head
dim over the length, and our Triton kernel's speed-ups (analysis.py plots them)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from cs336_systems.reporting.analysis import empty_figure, load, save
from cs336_systems.reporting.analysis import ok as trusted
from cs336_systems.stages.flash.rows import impls_of, label, ms, speedups, sweep

NAMES = ["latency", "tflops", "speedup"]


def _grid_figure(df: pd.DataFrame, value, ylabel: str, title: str, path: Path, logy=True) -> Path:
    dtypes = sorted(df["dtype"].unique())
    dims = sorted(df["d_head"].unique())
    fig, axes = plt.subplots(
        len(dtypes),
        len(dims),
        figsize=(3.2 * len(dims), 2.8 * len(dtypes)),
        squeeze=False,
        sharex=True,
    )
    for i, dt in enumerate(dtypes):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            sub = trusted(df[(df["dtype"] == dt) & (df["d_head"] == d)])
            for impl in impls_of(df):
                g = sub[sub["impl"] == impl].sort_values("seq_len")
                y = value(g)
                if len(g) and y.notna().any():
                    ax.plot(g["seq_len"], y, "-o", ms=3, label=label(impl))
            ax.set_xscale("log", base=2)
            if logy:
                ax.set_yscale("log")
                # a narrow log range labels its minor ticks, which then collide: majors only
                ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"{dt}, d={d}", fontsize=9)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if i == len(dtypes) - 1:
                ax.set_xlabel("n", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for row in axes:
        for ax in row:
            h, lab = ax.get_legend_handles_labels()
            if len(lab) > len(labels):
                handles, labels = h, lab
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    else:  # every point failed, was skipped or is suspect: say so instead of an empty legend
        fig.text(0.5, 0.03, "no trusted point to draw", ha="center", fontsize=9, color="0.4")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return save(fig, path, tight=False)


def _speedup_figure(sp: pd.DataFrame, path: Path) -> Path:
    """Their time / ours per length (median over d), per dtype: filled where no point at that
    length is host-bound (rows.py HOST_RATIO), open where one is (the median then mixes host
    overhead in); the headline speed-ups use only the filled points' rows."""
    if len(sp) == 0:
        return empty_figure(path, "flash: our Triton kernel has no successful point to compare")
    dtypes = sorted(sp["dtype"].unique())
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5.5 * len(dtypes), 3.8), squeeze=False)
    sp = sp.assign(host=sp["ours_host"] | sp["theirs_host"])
    for ax, dt in zip(axes[0], dtypes, strict=True):
        sub = sp[sp["dtype"] == dt]
        for impl in impls_of(sub):
            g = (
                sub[sub["impl"] == impl]
                .groupby("seq_len")
                .agg(speedup=("speedup", "median"), host=("host", "any"))
            )
            (line,) = ax.plot(g.index, g["speedup"], "-", lw=1, label=label(impl))
            clean = g[~g["host"]]
            ax.plot(clean.index, clean["speedup"], "o", ms=4, color=line.get_color())
            ax.plot(g.index[g["host"]], g["speedup"][g["host"]], "o", ms=4, mfc="none",
                    color=line.get_color())  # fmt: skip
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set(yscale="log", xlabel="n", title=f"{dt}: their time / our Triton time")
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xscale("log", base=2)
        # plain numbers at 1, 2, 5 of each decade of the log axis (not 3×10⁰), no minor labels
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.plot([], [], "o", ms=4, mfc="none", color="0.3", label="open: a host-bound point")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("speed-up (median over d), fwd+bwd")
    return save(fig, path)


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "flash")
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    if len(df) == 0 or len(sweep(df)) == 0:
        return [empty_figure(fig_dir / f"flash_{n}.png", "flash: no data") for n in NAMES]
    sw = sweep(df)
    return [
        _grid_figure(
            sw,
            lambda g: ms(g, "fwd_bwd"),
            "fwd+bwd ms (median)",
            "Causal attention, forward+backward latency",
            fig_dir / "flash_latency.png",
        ),
        _grid_figure(
            sw,
            lambda g: g.get("fwd_bwd_tflops", pd.Series(np.nan, index=g.index)),
            "TFLOP/s",
            "Causal attention, forward+backward TFLOP/s (flops.attention_flops)",
            fig_dir / "flash_tflops.png",
            logy=False,
        ),
        _speedup_figure(speedups(df), fig_dir / "flash_speedup.png"),
    ]
