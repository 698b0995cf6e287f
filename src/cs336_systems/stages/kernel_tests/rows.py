"""The `kernel_tests` stage's rows as the report reads them: per kernel, its tests by outcome,
their summed time and the verdict the benchmark stages use; the workers the times are summed
over; the failures and the slowest tests. Used by analysis.py and figures.py."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import md_table

OUTCOMES = ["passed", "failed", "error", "skipped"]


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


def workers(df: pd.DataFrame) -> str:
    """What the test times are summed over: the parallel workers, or the tests."""
    n = pd.to_numeric(df.get("pytest_workers", pd.Series(dtype=float)), errors="coerce").max()
    return f"{int(n)} workers" if n == n and n > 1 else "the tests"


def failures_table(df: pd.DataFrame) -> str:
    """The first 30 failed or erroring tests with their messages."""
    bad = df[df["outcome"].isin(["failed", "error"])]
    return md_table(bad[["test", "outcome", "message"]].head(30)) if len(bad) else ""


def slowest_table(df: pd.DataFrame) -> str:
    slowest = df.sort_values("duration_ms", ascending=False).head(5)
    return md_table(slowest[["test", "outcome", "duration_ms"]])
