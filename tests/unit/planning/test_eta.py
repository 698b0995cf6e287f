"""The run's estimate and the time left: every job the workflow plans has the budget's estimate
(budget/forecast.py), and planning/eta.py counts the finished jobs and scales the rest by how the run
goes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipeline_utils import ROOT, env_for, snakemake

from cs336_systems.budget import forecast
from cs336_systems.planning import eta


def planned(*config: str) -> list[dict]:
    """The jobs of a forced dry run of the default target: [{rule, wildcards, outputs, shell}]."""
    proc = snakemake(ROOT, "-n", "-p", "--forceall", "report", *config, timeout=600)
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:\n)", proc.stdout):
        head = re.match(r"(?:local)?rule (\w+):\n", block)
        if not head or head.group(1) == "all":
            continue
        wc = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        out = re.search(r"^\s+output: (.*)$", block, re.M)
        shell = re.search(r"^Shell command: (.*)$", block, re.M)
        wildcards = dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {}
        jobs.append(
            {"rule": head.group(1), "wildcards": wildcards, "outputs": out.group(1).split(", "),
             "shell": shell.group(1) if shell else ""}
        )  # fmt: skip
    return jobs


# a measuring job runs a stage's own entry point (`python3 -m cs336_systems.stages.<stage> `),
# not its analysis or aggregate
MEASURES = re.compile(r"(?:python3?|\$PY) -m cs336_systems\.stages\.\w+ ")


@pytest.mark.parametrize("preset", ["cpu", "gpu"], ids=["cpu-preset", "gpu-preset"])
def test_every_measuring_job_has_its_stages_estimate(preset):
    """Every job that measures (from the dry run's shell commands, not from the budget's own
    list) is named in its stage's ETA_KEYS and estimated by its stage's plan."""
    from cs336_systems.budget import run_config

    config = run_config()
    jobs = planned("--config", f"preset={preset}", "machine=eta-test")
    measuring = {j["rule"] for j in jobs if MEASURES.search(j["shell"])}
    assert len(measuring) >= 15
    assert measuring <= set(forecast.eta_keys(config)), measuring - set(forecast.eta_keys(config))
    est = forecast.estimates(config, preset, jobs)
    assert not [e["name"] for e in est if e["unestimated"]]
    assert all(e["seconds"] > 0 for e in est)


def test_a_named_job_without_its_estimate_is_unestimated():
    """A measuring rule whose job name the budget has no job for is flagged, not 1.5 s."""
    from cs336_systems.budget import run_config

    job = {"rule": "memory", "wildcards": {"size": "no-such-size"}, "outputs": ["x"]}
    (e,) = forecast.estimates(run_config(), "cpu", [job])
    assert e["unestimated"]
    (local,) = forecast.estimates(run_config(), "cpu", [{**job, "rule": "memory_plots"}])
    assert not local["unestimated"] and local["seconds"] == 1.5


def test_the_time_left_counts_finished_jobs_and_scales_by_the_run(tmp_path):
    start = time.time() - 100
    files = [tmp_path / f"{i}.csv" for i in range(4)]
    plan = {
        "start": start,
        "parallel": 2,
        "jobs": [
            {"name": f"job {i}", "outputs": [str(f)], "seconds": 40.0} for i, f in enumerate(files)
        ],
    }
    # nothing done yet: the budget's estimate as it is
    assert eta.progress(plan, start + 10).endswith("about 1.3 min left (the budget's estimate)")
    # an output older than the run's start is a past run's: not done
    files[0].write_text("x")
    os.utime(files[0], (start - 60, start - 60))
    assert eta.progress(plan, start + 10).startswith("0 of 4 jobs done")
    # two done in 50 s against 40 s estimated (40 s each over 2 at once): x1.25 on the rest
    for f in files[:2]:
        f.write_text("x")
    line = eta.progress(plan, start + 50)
    assert line.startswith("2 of 4 jobs done in 50 s"), line
    assert "about 50 s left (the budget's estimate, x1.2 as this run goes)" in line
    for f in files[2:]:
        f.write_text("x")
    assert eta.progress(plan, start + 100).endswith("the run's estimate was 1.3 min")


def test_a_job_prints_the_time_left_after_it(tmp_path):
    """The rules' shell suffix (`python -m cs336_systems.planning.eta`): one log line from the
    file $CS336_ETA names, nothing without it."""
    out = tmp_path / "a.csv"
    out.write_text("x")
    eta.write(
        tmp_path / "eta.json",
        [{"name": "a", "outputs": [str(out)], "seconds": 5.0}],
        1,
        time.time() - 5,
    )
    env = {**env_for(ROOT), eta.ENV: str(tmp_path / "eta.json")}
    cmd = [sys.executable, "-m", "cs336_systems.planning.eta"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert " eta INFO  1 of 1 jobs done in " in proc.stderr, proc.stderr
    env[eta.ENV] = str(tmp_path / "absent.json")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""


def test_the_start_line_and_the_file(tmp_path):
    jobs = [{"rule": "ceilings", "wildcards": {}, "outputs": [str(tmp_path / "c.csv")]},
            {"rule": "report", "wildcards": {}, "outputs": [str(tmp_path / "r.md")]}]  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    from cs336_systems.budget import run_config

    (tmp_path / "config.json").write_text(json.dumps(run_config()))
    forecast.main(
        ["--jobs", str(tmp_path / "jobs.json"), "--config", str(tmp_path / "config.json"),
         "--out", str(tmp_path / "eta.json"), "--preset", "cpu", "--parallel", "2"]
    )  # fmt: skip
    plan = json.loads((tmp_path / "eta.json").read_text())
    assert [j["name"] for j in plan["jobs"]] == ["ceilings", "report"]
    assert plan["parallel"] == 2 and plan["jobs"][1]["seconds"] > 0
    assert Path(plan["jobs"][0]["outputs"][0]).name == "c.csv"
