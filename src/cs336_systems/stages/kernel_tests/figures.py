"""The kernel_tests section's figure: tests per kernel by outcome, and their test time summed
over the parallel workers (analysis.py plots it)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from cs336_systems.reporting.analysis import empty_figure, load, save
from cs336_systems.stages.kernel_tests.rows import OUTCOMES, per_kernel, workers

COLORS = {"passed": "tab:green", "failed": "tab:red", "error": "tab:purple", "skipped": "0.7"}


def draw(results_dir: Path, fig_dir: Path) -> list[Path]:
    """Tests per kernel by outcome, and their test time summed over the parallel workers (each
    worker runs its share at once: the sum is not the suite's wall time, which the title
    gives)."""
    df = load(results_dir, "kernel_tests")
    path = Path(fig_dir) / "kernel_tests_durations.png"
    if len(df) == 0:
        return [empty_figure(path, "kernel_tests: no data")]
    table = per_kernel(df)
    kernels = list(table["kernel"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.5 * len(kernels) + 1.8))
    counts = df.pivot_table(index="kernel", columns="outcome", values="test", aggfunc="count")
    counts = counts.reindex(columns=OUTCOMES).fillna(0).loc[kernels]
    seconds = df.pivot_table(index="kernel", columns="outcome", values="duration_ms", aggfunc="sum")
    seconds = (seconds.reindex(columns=OUTCOMES).fillna(0) / 1e3).loc[kernels]
    for ax, data, xlabel in (
        (a1, counts, "tests"),
        (a2, seconds, f"test time summed over {workers(df)} (s)"),
    ):
        left = np.zeros(len(kernels))
        for outcome in OUTCOMES:
            ax.barh(kernels, data[outcome], left=left, color=COLORS[outcome], label=outcome)
            left = left + data[outcome].to_numpy()
        ax.set_xlim(0, max(left.max(), 1e-9) * 1.08)
        ax.set_xlabel(xlabel)
    a2.set_yticks([])
    a1.legend(fontsize=8, loc="upper right")
    suite = float(df["suite_s"].iloc[0]) if "suite_s" in df else float("nan")
    fig.suptitle(f"Kernel tests: {len(df)} tests, {suite:.0f} s of wall time", fontsize=10)
    return [save(fig, path)]
