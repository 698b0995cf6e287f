"""Report context for the `kernel_tests` stage: per-kernel verdicts, failures, durations."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from cs336_systems.reporting.analysis import empty_figure, load, md_table, plot_main, save

OUTCOMES = ["passed", "failed", "error", "skipped"]
COLORS = {"passed": "tab:green", "failed": "tab:red", "error": "tab:purple", "skipped": "0.7"}


def per_kernel(df):
    """kernel x outcome counts, total seconds and the verdict the benchmark stages use."""
    counts = df.pivot_table(index="kernel", columns="outcome", values="test", aggfunc="count")
    counts = counts.reindex(columns=OUTCOMES).fillna(0).astype(int)
    counts["test s (summed over workers)"] = df.groupby("kernel")["duration_ms"].sum() / 1e3
    counts["verdict"] = [
        "—"
        if kernel == "other"
        else "failed"
        if row.failed + row.error
        else "passed"
        if row.passed
        else "not run"
        for kernel, row in counts.iterrows()
    ]
    return counts.reset_index()


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
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
        (a2, seconds, f"test time summed over {_workers(df)} (s)"),
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


def _workers(df: pd.DataFrame) -> str:
    n = pd.to_numeric(df.get("pytest_workers", pd.Series(dtype=float)), errors="coerce").max()
    return f"{int(n)} workers" if n == n and n > 1 else "the tests"


def context(results_dir: Path) -> dict:
    df = load(results_dir, "kernel_tests")
    if len(df) == 0:
        return {"available": False}
    table = per_kernel(df)
    bad = df[df["outcome"].isin(["failed", "error"])]
    first = df.iloc[0]
    verdicts = dict(zip(table["kernel"], table["verdict"], strict=True))
    slowest = df.sort_values("duration_ms", ascending=False).head(5)
    return {
        "available": True,
        "n_tests": len(df),
        "counts": {o: int((df["outcome"] == o).sum()) for o in OUTCOMES},
        "device_name": first.get("device_name", "?"),
        # the CSV keeps the comma-joined list the CLI got; a reader gets "a, b"
        "files": ", ".join(f for f in str(first.get("files") or "").split(",") if f),
        "select": first.get("select", "") if isinstance(first.get("select", ""), str) else "",
        "marker": first.get("marker", "") if isinstance(first.get("marker", ""), str) else "",
        "suite_s": float(first.get("suite_s", float("nan"))),
        "workers": _workers(df),
        "test_s": float(df["duration_ms"].sum() / 1e3),
        "kernel_table": md_table(table),
        "verdicts": {k: v for k, v in verdicts.items() if k != "other"},
        "failed_kernels": sorted(k for k, v in verdicts.items() if v == "failed"),
        "failures": md_table(bad[["test", "outcome", "message"]].head(30)) if len(bad) else "",
        "n_failures": len(bad),
        "slowest": md_table(slowest[["test", "outcome", "duration_ms"]]),
        "interpreter": not bool(first.get("cuda_available", False)),
    }


if __name__ == "__main__":
    plot_main(plot)
