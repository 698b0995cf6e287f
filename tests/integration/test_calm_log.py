"""A run's console stays calm: the finished tiny run's Snakemake log is mostly the jobs' progress,
with at most a few WARNING lines (a point's Python warnings and tracebacks go to its job's log
alone, planning/tee.py)."""

from __future__ import annotations

from cs336_systems.planning.log import LOG_ONLY, warning_lines

MAX_WARNING_SHARE = 0.05


def test_the_tiny_runs_snakemake_log_has_few_warning_lines(finished_tiny_run):
    logs = sorted((finished_tiny_run / ".snakemake" / "log").glob("*.snakemake.log"))
    assert logs, "the finished tiny run kept no Snakemake log"
    warned = total = 0
    for path in logs:
        w, n = warning_lines(path.read_text())
        warned, total = warned + w, total + n
    assert total > 50, total  # the jobs' progress is there
    assert warned <= MAX_WARNING_SHARE * total, f"{warned} WARNING lines of {total}"
    jobs = list((finished_tiny_run / "results").glob("*/logs/**/*.log"))
    assert jobs and not any(LOG_ONLY in p.read_text() for p in jobs)
