"""Which jobs ran beside which (planning/neighbours.py), and the claim's record of a job it runs
(planning/claim.py): start and end, cards and cores, the child's exit status passed on."""

from __future__ import annotations

import os
import subprocess
import sys

from cs336_systems.planning import claim, neighbours


def test_overlapping_records_are_neighbours_and_a_running_job_overlaps_what_follows(tmp_path):
    for job, start, end in [("a", 0, 10), ("b", 5, 15), ("c", 20, 30), ("d", 25, None)]:
        record = {"job": job, "what": f"stage {job}", "start": start}
        neighbours.write(tmp_path, record if end is None else {**record, "end": end})
    records = neighbours.read(tmp_path)
    assert neighbours.neighbours(records, "a") == ["stage b"]
    assert neighbours.neighbours(records, "c") == ["stage d"]  # d has no end: still running
    assert neighbours.neighbours(records, "zzz") == []
    assert neighbours.read(tmp_path / "missing") == {}


def test_describe_names_the_stage_and_its_output():
    command = ["python3", "-m", "cs336_systems.stages.ddp", "--out", "results/m/ddp/v.csv"]
    assert neighbours.describe(command) == "ddp results/m/ddp/v.csv"


def test_the_claim_records_the_job_it_runs_and_passes_its_status_on(tmp_path):
    env = {**os.environ, neighbours.FOLDER_ENV: str(tmp_path)}
    env.pop("SLURM_JOB_ID", None)
    script = "import os, sys; print(os.environ['CS336_JOB_ID']); sys.exit(3)"
    proc = subprocess.run(
        [sys.executable, "-m", "cs336_systems.planning.claim", "0", sys.executable, "-c", script],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    (record,) = neighbours.read(tmp_path).values()
    assert record["job"] == proc.stdout.strip() and record["returncode"] == 3
    assert record["end"] >= record["start"] and record["cards"] == [] and record["cpu_set"]
    assert claim.neighbours is neighbours
