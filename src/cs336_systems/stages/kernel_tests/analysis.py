"""Report context for the `kernel_tests` stage: per-kernel verdicts, failures, durations. rows.py
holds the tables, figures.py the figure."""

from __future__ import annotations

from pathlib import Path

from cs336_systems.reporting.analysis import load, md_table, plot_main
from cs336_systems.stages.kernel_tests.figures import draw
from cs336_systems.stages.kernel_tests.rows import (
    OUTCOMES,
    failures_table,
    outcomes_by_test,
    per_file,
    per_kernel,
    slowest_table,
    workers,
)


def plot(results_dir: Path, fig_dir: Path) -> list[Path]:
    return draw(results_dir, fig_dir)


def _text(value) -> str:
    """A CSV field that is text, else '' (an empty field reads back as nan)."""
    return value if isinstance(value, str) else ""


def context(results_dir: Path) -> dict:
    df = load(results_dir, "kernel_tests")
    if len(df) == 0:
        return {"available": False}
    table = per_kernel(df)
    tests = outcomes_by_test(df)
    first = df.iloc[0]
    verdicts = dict(zip(table["kernel"], table["verdict"], strict=True))
    return {
        "available": True,
        "n_tests": len(df),
        "counts": {o: int((df["outcome"] == o).sum()) for o in OUTCOMES},
        "device_name": first.get("device_name", "?"),
        # the CSV keeps the comma-joined list the CLI got; a reader gets "a, b"
        "files": ", ".join(f for f in str(first.get("files") or "").split(",") if f),
        "select": _text(first.get("select", "")),
        "marker": _text(first.get("marker", "")),
        "suite_s": float(first.get("suite_s", float("nan"))),
        "workers": workers(df),
        "test_s": float(df["duration_ms"].sum() / 1e3),
        "kernel_table": md_table(table),
        # each test's file, name and outcome: the coverage table's code parts count them
        "tests": tests,
        "file_table": per_file(tests),
        "verdicts": {k: v for k, v in verdicts.items() if k != "other"},
        "failed_kernels": sorted(k for k, v in verdicts.items() if v == "failed"),
        "failures": failures_table(df),
        "n_failures": int(df["outcome"].isin(["failed", "error"]).sum()),
        "slowest": slowest_table(df),
        "interpreter": not bool(first.get("cuda_available", False)),
    }


if __name__ == "__main__":
    plot_main(plot)
