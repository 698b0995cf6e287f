"""The leaderboard section's figure (analysis.py plots it): rank by rank, the engine's profiled
step on its timeline."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import empty_figure, ran, save
from cs336_systems.stages.leaderboard.rows import (
    PART_WORDS,
    PARTS,
    REST,
    load_rows,
    rank_parts,
    run_label,
)


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    """Rank by rank, the engine's profiled step on its timeline: the compute parts, exposed
    communication and idle time (GPU) or the host's rest (CPU), adding up to the step."""
    df = load_rows(results_dir)
    path = Path(fig_dir) / "leaderboard_breakdown.png"
    d = ran(df) if len(df) else pd.DataFrame()
    full = d[d["config"].isin(["full", "reduced"]) & (d["variant"] == "engine")] if len(d) else d
    ranks = rank_parts(full.iloc[0]) if len(full) else {}
    if not ranks:
        why = "no profiled leaderboard step" + (
            f" ({df['status'].iloc[0]})" if len(df) and "status" in df else ""
        )
        return [empty_figure(path, why)]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(ranks)))
    labels = [f"rank {k}" for k in sorted(ranks)]
    bottom = np.zeros(len(ranks))
    for p in (*PARTS, *REST):
        vals = np.array([ranks[k].get(p, 0.0) for k in sorted(ranks)]) / 1e3
        if vals.any():
            ax.barh(labels, vals, left=bottom, label=PART_WORDS.get(p, p))
            bottom += vals
    ax.set_xlabel("seconds of one profiled step (device timeline: parts add up to the step)")
    # the legend in one row between the bar and the title, the title lifted above it
    ax.set_title(f"where a leaderboard step goes: {run_label(full.iloc[0])}", pad=22)
    n = len(ax.get_legend_handles_labels()[1])
    ax.legend(fontsize=7, ncol=n, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return [save(fig, path)]
