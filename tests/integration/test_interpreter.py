"""The rules run the interpreter Snakemake runs under (common.smk's PY, set as $PY by the shell
prefix), not whatever `python3` comes first on PATH: `.venv/bin/snakemake` works without the
environment activated."""

from __future__ import annotations

import re

from pipeline_utils import TINY_RUN, copy_run, env_for, snakemake

# a cheap job of the finished tiny run: reads the points' CSVs, writes benchmark.csv
TARGET = "benchmark_aggregate"


def test_a_job_runs_with_the_environment_off_path(finished_tiny_run, tmp_path):
    """One real job, forced, with PATH holding only the system's directories (whose python3, if
    any, lacks the package): its shell runs `$PY`, never a bare python3, and the job succeeds."""
    work = copy_run(finished_tiny_run, tmp_path / "run")
    env = env_for(work)
    env["PATH"] = "/usr/bin:/bin"
    env.pop("CS336_PYTHON", None)
    proc = snakemake(work, "--forcerun", TARGET, "-p", TARGET, *TINY_RUN, env=env)
    out = proc.stdout + proc.stderr
    assert re.search(rf"^(local)?rule {TARGET}:", out, re.M), out[-2000:]
    commands = [line for line in out.splitlines() if " -m cs336_systems." in line]
    assert commands, out[-2000:]
    for line in commands:
        assert not re.search(r"(^|[\s;(|])python3? -m", line), line
        assert "$PY -m cs336_systems" in line, line
    assert "1 of 1 steps (100%) done" in out
