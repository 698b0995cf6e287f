"""The checkpointing section's figure: each strategy's peak memory (measured and modelled) and
step time, per precision (analysis.py plots it)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from cs336_systems.reporting.analysis import empty_figure, load, save
from cs336_systems.stages.checkpointing.rows import GiB_PER_MiB, peak_column


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    df = load(results_dir, "checkpointing")
    path = Path(fig_dir) / "checkpointing_strategies.png"
    if len(df) == 0:
        return [empty_figure(path, "no checkpointing data")]
    col = peak_column(df)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for prec, g in df.groupby("precision", sort=False):
        x = range(len(g))
        measured = g[col].where(g["status"] == "ok")
        axes[0].plot(x, measured * GiB_PER_MiB, "o-", label=f"{prec} measured")
        axes[0].plot(x, g["model_peak_mb"] * GiB_PER_MiB, "x--", label=f"{prec} model")
        axes[1].plot(x, g["step_ms_mean"].where(g["status"] == "ok"), "o-", label=prec)
        for ax in axes:
            ax.set_xticks(list(x), list(g["strategy"]), rotation=45, ha="right")
    axes[0].set_ylabel("peak above parameters, grads, optimizer (GiB)")
    axes[1].set_ylabel("training step (ms)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    return [save(fig, path)]
