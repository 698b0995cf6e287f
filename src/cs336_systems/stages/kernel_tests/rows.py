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


def _module(path: str) -> str:
    """A test file's module as JUnit names its cases' class: tests/unit/x.py -> tests.unit.x."""
    return path.removesuffix(".py").replace("/", ".")


def file_of(test: str, files: list[str]) -> str:
    """The test file of a row's `test` (JUnit's `classname::name`): the file whose module is
    its class name or the module of its class; '' for a row of the pytest run itself."""
    classname = test.split("::", 1)[0]
    for f in sorted(files, key=len, reverse=True):
        if classname == _module(f) or classname.startswith(_module(f) + "."):
            return f
    return ""


def outcomes_by_test(df: pd.DataFrame) -> pd.DataFrame:
    """Each test's file, name and outcome: what the report's coverage table counts per code
    part (reporting/coverage.py: part_tests)."""
    files = [f for v in df.get("files", pd.Series(dtype=str)).dropna().astype(str).unique()
             for f in v.split(",") if f]  # fmt: skip
    out = pd.DataFrame(
        {
            "file": [file_of(str(t), files) for t in df["test"]],
            # rows written before the CSV named each test apart from its node id: the id
            "name": df.get("name", df["test"]).astype(str),
            "outcome": df["outcome"].astype(str),
        }
    )
    return out[out["file"] != ""].reset_index(drop=True)


def per_file(tests: pd.DataFrame) -> str:
    """Per test file: its tests by outcome."""
    if not len(tests):
        return ""
    counts = tests.pivot_table(index="file", columns="outcome", values="name", aggfunc="count")
    counts = counts.reindex(columns=OUTCOMES).fillna(0).astype(int).reset_index()
    return md_table(counts)


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
