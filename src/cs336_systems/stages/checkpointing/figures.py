"""The checkpointing section's figure: each strategy's peak memory (measured and modelled) and
step time, per precision (analysis.py plots it). A strategy that did not run has no measured
point; where none ran, each panel says so, with the rows' statuses."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import empty_figure, load, save, status_counts
from cs336_systems.stages.checkpointing.rows import GiB_PER_MiB, peak_column


def _column(g: pd.DataFrame, col: str) -> pd.Series:
    """`col` where the strategy ran (NaN elsewhere, and where the CSV has no such column)."""
    values = g[col] if col in g else pd.Series(np.nan, index=g.index)
    return values.where(g["status"] == "ok")


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "checkpointing")
    path = Path(fig_dir) / "checkpointing_strategies.png"
    if len(df) == 0:
        return [empty_figure(path, "no checkpointing data")]
    col = peak_column(df)
    strategies = list(dict.fromkeys(df["strategy"]))
    x = {s: i for i, s in enumerate(strategies)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for prec, g in df.groupby("precision", sort=False):
        at = g["strategy"].map(x)
        axes[0].plot(at, _column(g, col) * GiB_PER_MiB, "o-", label=f"{prec} measured")
        axes[0].plot(at, g["model_peak_mb"] * GiB_PER_MiB, "x--", label=f"{prec} model")
        axes[1].plot(at, _column(g, "step_ms_mean"), "o-", label=prec)
    ran = (df["status"] == "ok").any()
    counts = ", ".join(f"{v} {k}" for k, v in sorted(status_counts(df).items()))
    for ax in axes:
        ax.set_xticks(range(len(strategies)), strategies, rotation=90)
        ax.grid(alpha=0.3)
        if not ran:
            ax.text(0.5, 0.5, f"no strategy ran\n({counts})", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="0.4")  # fmt: skip
    axes[0].set_ylabel("peak above parameters, grads, optimizer (GiB)")
    axes[1].set_ylabel("training step (ms)")
    axes[0].legend(fontsize=8)
    if ran:
        axes[1].legend(fontsize=8)
    return [save(fig, path)]
