"""Planning scales: a generated 10,000-point benchmark sweep plans in under 30 s on CI's two
cores, and planning never imports torch (GPUs and the machine tag come from nvidia-smi)."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from pipeline_utils import copy_workflow, env_for, snakemake, timed_snakemake


def sweep(points: int) -> dict:
    """One benchmark job per context length: `points` jobs and their aggregate."""
    return {
        "preset": "cpu",
        "machine": "sweep",
        "stages": ["benchmark"],
        "benchmark": {
            "cpu": {
                "sizes": ["tiny"],
                "context_lengths": list(range(1, points + 1)),
                "attentions": ["naive"],
                "compile": ["eager"],
            }
        },
    }


def test_a_ten_thousand_point_sweep_plans_in_under_30_s(tmp_path):
    """The plan of 10,000 benchmark points (`--summary`: the DAG and what each job would do,
    one line per output, without `-n`'s listing of every job's rule, inputs and command,
    which is Snakemake's printing and about doubles the time)."""
    work = copy_workflow(tmp_path)
    config = work / "sweep.yaml"
    config.write_text(yaml.safe_dump(sweep(10_000)))
    proc, wall, cpu = timed_snakemake(work, "--summary", "--configfile", str(config))
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    pending = [r for r in rows if len(r) > 5 and r[2] == "benchmark" and r[5] == "update pending"]
    assert len(pending) == 10_000, proc.stdout[-2000:]
    assert cpu < 30, f"planned 10,000 points in {cpu:.1f} CPU s ({wall:.1f} s wall)"


def test_planning_imports_no_torch(tmp_path):
    work = copy_workflow(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "snakemake", "--cores", "1", "-n", "report"],
        cwd=work,
        env=env_for(work),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(re.findall(r"\|\s+([\w.]+)\s*$", proc.stderr, re.M))
    assert "cs336_systems.planning.config" in imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}


def test_the_default_plan_takes_seconds(tmp_path):
    """A dry run of the default CPU run (every stage, nothing done yet): under 5 s on CI."""
    work = copy_workflow(tmp_path)
    snakemake(work, "-n")  # the first run writes the import-graph cache and the code stamps
    proc, wall, cpu = timed_snakemake(work, "-n")
    assert "report" in proc.stdout
    assert cpu < 5.0, f"planned the default run in {cpu:.1f} CPU s ({wall:.1f} s wall)"
