"""The reference runs' job logs against the stages' estimates (stages/<stage>/plan.py; the calibration
tables of docs/budgets.md). tests/unit/budget/test_budget.py holds the H100's jobs each within 25% and their
sum within 10%; the CPU's (two jobs at once on two cores, so each job's time depends on its
neighbour) each within a factor of 2 and their sum within 15%.

A job log is the reference report's own (report/reference/<machine>/jobs/<stage>/<job>.tsv,
Snakemake's `benchmark:` files, first column: seconds), so a new reference run recalibrates
against itself: when its times move, the test says which constant to revisit.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd

from cs336_systems.budget import CPU2, H100, ROOT, Device, Job, plan

REFERENCE_JOBS = ROOT / "report" / "reference" / "h100-80gb-hbm3" / "jobs"
# the committed cpu reference's job log: its jobs ran one at a time (CPU2's `alone`)
CPU_REFERENCE_JOBS = ROOT / "report" / "reference" / "cpu" / "jobs"
# the CPU2 constants' calibration run (a host with bf16 units, two jobs at a time), kept apart
# from the committed cpu reference, whose jobs ran one at a time
CPU_JOBS = ROOT / "docs" / "measurements" / "budget-cpu-34787cd" / "jobs"
# the step counts a run records in its rows: a reference run made under other counts than the
# config's is estimated under its own (its `csv/` beside `jobs/`)
RUN_KEYS = {
    "benchmark": ("warmup_steps", "measure_steps"),
    "attention": ("warmup_steps", "fwd_steps", "bwd_steps"),
}


def _warmup_as_run(config: dict, preset: str, csv: Path) -> None:
    """A warm-up sweep whose rows name no process ran every count in its job's process; so did
    a run without its sweep's CSV whose benchmark rows predate the job records (no `job_id`)."""
    block = config.get("benchmark", {}).get(preset, {}).get("warmup_sweep")
    if block is None:
        return
    if csv.exists():
        block["fresh_process"] = "process_id" in pd.read_csv(csv, nrows=0).columns
    elif (points := csv.with_name("benchmark.csv")).exists():
        block["fresh_process"] = "job_id" in pd.read_csv(points, nrows=0).columns


def as_run(config: dict, preset: str, csv_dir: Path) -> dict:
    """`config` with the step counts the run in `csv_dir` recorded (one value per key), so that
    its job log is compared with the estimate of what it ran, not of today's config."""
    config = copy.deepcopy(config)
    for stage, keys in RUN_KEYS.items():
        csv = Path(csv_dir) / f"{stage}.csv"
        block = config.get(stage, {}).get(preset)
        if block is None or not csv.exists():
            continue
        df = pd.read_csv(csv, usecols=lambda c, keys=keys: c in keys)
        for key in keys:
            vals = pd.to_numeric(df.get(key, pd.Series(dtype=float)), errors="coerce").dropna()
            if vals.nunique() == 1 and key in block:
                block[key] = int(vals.iloc[0])
    _ceilings_as_run(config, preset, Path(csv_dir) / "ceilings.csv")
    ck = config.get("checkpointing", {}).get(preset)
    csv = Path(csv_dir) / "checkpointing.csv"
    if ck is not None and csv.exists():  # the precisions and step counts it ran
        df = pd.read_csv(csv, usecols=lambda c: c in ("precision", "measure_steps"))
        ck["precisions"] = list(dict.fromkeys(df["precision"].dropna()))
        if df["measure_steps"].nunique() == 1:
            ck["measure_steps"] = int(df["measure_steps"].iloc[0])
    _flash_as_run(config, preset, Path(csv_dir) / "flash.csv")
    _warmup_as_run(config, preset, Path(csv_dir) / "benchmark_warmup.csv")
    _engines_as_run(config, preset, Path(csv_dir) / "benchmark.csv")
    if ck is not None and csv.exists():  # the strategies it ran
        names = list(pd.read_csv(csv, usecols=["strategy"])["strategy"].dropna())
        ck["block_sizes"] = [int(n[6:]) for n in names if n.startswith("every_")]
        ck["nested"] = [n for n in names if n in ("sqrt", "halving", "chain")]
        ck["sub_block"] = [n for n in names if n in ("attn", "ffn", "halves")]
    profile = config.get("profile", {}).get(preset)
    csv = Path(csv_dir) / "profile.csv"
    if profile is not None and csv.exists():
        cols = pd.read_csv(csv, nrows=0).columns
        if "harness_measure_steps" not in cols:  # a run from before the harness's forward
            profile["harness"] = {"warmup_steps": 0, "measure_steps": 0}
    return config


def _engines_as_run(config: dict, preset: str, csv: Path) -> None:
    """The benchmark's engines as the run in `csv` had them (its rows' `engine`): the HF peer
    left the 2026 gpu preset after the H100 reference ran it."""
    block = config.get("benchmark", {}).get(preset)
    if block is None or not csv.exists():
        return
    cols = pd.read_csv(csv, nrows=0).columns
    if "engine" in cols:
        ran = set(pd.read_csv(csv, usecols=["engine"])["engine"].dropna())
        block["engines"] = [e for e in ("plain", "fast", "hf_gpt2") if e in ran | {"plain"}]


# a flash row capped by `max_seq_len` (stages/flash/jobs.py CAP_SKIP): the cap, the impl, a dtype
_FLASH_CAP = re.compile(r"max_seq_len (\d+) for (\w+)(?: in (\w+))?")


def _flash_as_run(config: dict, preset: str, csv: Path) -> None:
    """The flash sweep's implementations, axes and caps, and the target's axes, as the run in
    `csv` had them (its rows), so that a grid changed since is not set against its job log."""
    block = config.get("flash", {}).get(preset)
    if block is None or not csv.exists():
        return
    df = pd.read_csv(csv)
    sweep = df[df["grid"] == "sweep"]
    if len(sweep):
        block["impls"] = list(dict.fromkeys(sweep["impl"]))
        block["seq_lens"] = sorted(int(n) for n in sweep["seq_len"].unique())
        block["head_dims"] = sorted(int(d) for d in sweep["d_head"].unique())
        caps: dict = {}
        for status in sweep["status"].astype(str).unique():
            if m := _FLASH_CAP.search(status):
                n, impl, dtype = int(m.group(1)), m.group(2), m.group(3)
                caps[impl] = {**caps.get(impl, {}), dtype: n} if dtype else n
        block["max_seq_len"] = caps
    target = df[df["grid"] == "target"]
    if len(target) and block.get("target"):
        block["target"]["head_dims"] = sorted(int(d) for d in target["d_head"].unique())
        block["target"]["seq_lens"] = sorted(int(n) for n in target["seq_len"].unique())


def _ceilings_as_run(config: dict, preset: str, csv: Path) -> None:
    """The ceilings a run measured (stages/ceilings/plan.py: `as_measured`)."""
    from cs336_systems.stages.ceilings.plan import as_measured

    block = config.get("ceilings", {}).get(preset)
    if block is not None and csv.exists():
        as_measured(block, pd.read_csv(csv))


def log_name(job: Job) -> str:
    """The job's `benchmark:` file under jobs/, without .tsv (workflow/rules/<stage>.smk)."""
    if job.stage == job.job:
        return job.stage
    if job.stage == "benchmark":
        if job.job.startswith("warm-up sweep "):
            return f"benchmark/warmup_{job.job.removeprefix('warm-up sweep ')}"
        return f"benchmark/{job.job.replace(' ', '_')}"
    if job.stage == "checkpointing" and job.job != "accounting":
        return f"checkpointing/strategies_{job.job}"
    if job.stage == "leaderboard":
        return "leaderboard/ablation" if job.job == "ablation" else "leaderboard/runs"
    return f"{job.stage}/{job.job}"


def measured_jobs(jobs_dir: Path = REFERENCE_JOBS) -> dict[str, float]:
    """{log name: seconds} of every job in a run's job log."""
    out = {}
    for tsv in sorted(Path(jobs_dir).rglob("*.tsv")):
        lines = tsv.read_text().splitlines()
        if len(lines) > 1:
            out[tsv.relative_to(jobs_dir).with_suffix("").as_posix()] = float(lines[1].split()[0])
    return out


def calibration(
    config: dict, preset: str = "gpu", dev: Device | None = None, jobs_dir: Path = REFERENCE_JOBS
) -> tuple[list[tuple], list[str], list[str]]:
    """((stage, job, measured s, estimated s) for every planned job the log holds; the planned
    jobs it lacks (local rules write no benchmark file); the logged jobs the plan lacks)."""
    times = measured_jobs(jobs_dir)
    config = as_run(config, preset, Path(jobs_dir).parent / "csv")
    jobs = [j for j in plan(config, preset, dev or H100) if j.stage != "(local)"]
    rows = [(j.stage, j.job, times[log_name(j)], j.seconds) for j in jobs if log_name(j) in times]
    missing = [log_name(j) for j in jobs if log_name(j) not in times]
    names = {log_name(j) for j in jobs}
    return rows, missing, [n for n in times if n not in names]


CALIBRATION_HEAD = """## Calibration: the constants against the reference runs' job logs

### One H100

The `H100` constants in budget/devices.py come from a reference run of the gpu preset on one
H100 80GB HBM3 (one Snakemake run of commit 50ebc65, 2026-11-25: 19.5 min of wall time, 18.8
with a job running; the run of dfdd876 a day earlier, on another host of the kind, took 21.2).
The table below holds them against the reference run committed now
(`report/reference/h100-80gb-hbm3/jobs/**/*.tsv`, one run of e0aec35, 2026-11-27, on another
host of the kind: 23.4 min of wall time, 23.4 with a job running). Where the job log alone
does not separate a constant, the job's own log (`results/<machine>/logs/`) did:

- rates (`tflops`): xl at context 512, batch 4, eager: training step 1030 ms in fp32 (41
  TFLOP/s through TF32), 217 ms in bf16 (197); forward 324 / 66 ms (44 / 213).
- `launch_s_per_layer`: small at 512, launch-bound: forward 17-29 ms, forward+backward 50-66
  ms, in fp32 and bf16 alike.
- `hbm_tbps`: attention naive_compiled, d=16, n=16384: a 16.7 ms forward for 3 ms of FLOPs.
- `job_start_s`: the jobs that only write status rows (allreduce, fsdp on one GPU; benchmark
  10B, every point skipped): 5.3-7.2 s. `gpu_init_s`: attention naive_eager's first point 10 s
  after its start.
- `compile_s`, `compile_s_per_layer`: the bf16 compiled forward and forward+backward graphs of
  small (12 layers) 46 s, xl (32 layers) 116 s. `engine_s`: an engine row at small 2 s beyond
  its steps, its model built; xl's three engine rows (one HF compile) within the xl job's 320 s.
- `capture_s`: profile small and medium, 9 torch.profiler captures each in 27 s (3 s a capture,
  its steps included). `snapshot_s`: memory xl, 8 snapshots in 41 s of points.
- `kernel_tests_s`: the cuda selection on 16 xdist workers, 151 s (121 s on the faster host of
  the d8dd021 run); `fixed_s`: precision 6 s, checkpointing accounting 27 s. The ceilings job
  (7.2 s for four matmuls and a copy) is its start and do_bench's windows, per measurement.
- ddp `variants` on one GPU: the one-process compute-only baseline (xl, 13 fp32 steps of
  1037 ms) in 31 s of its 37.

"""

CPU_HEAD = """### Two CPU cores

The `CPU2` constants come from the cpu preset's run of 34787cd, whose job log and step counts
are kept in `docs/measurements/budget-cpu-34787cd/` (a fresh clone, `snakemake --cores 2
report`: 3 min 2 s, on an AMD EPYC with AVX-512 bf16 units). Hosts without bf16 units run
slower: the earlier 2-core machine took 3 min 7 s to 4 min 2 s and skipped small's bf16 points;
the committed cpu reference (`report/reference/cpu/`, a run of 490f82d on another such host)
6 min 9 s, its jobs 0.97-2.8x their estimates here (443 s of jobs against 302 s
estimated). Two jobs ran at once, so a job's time depends on the one beside it; the
test holds each job within a factor of 2 and the sum within 15%. Since then each measuring job
holds both cores alone (the `timing` resource) and takes less: the cpu reference runs of
fa3b785 and e077f4b on such a host, 297 s and 245 s of jobs against 334 s estimated by these
constants, so the estimates a run plans with are theirs times `alone` (0.81, the middle), and a
test holds the committed cpu reference's jobs to that within 25% in sum. The benchmark's cost guard
divides by the ceilings stage's measured matmul rates (`peak_tflops`: fp32 0.081, bf16
autocast F.linear 0.18 TFLOP/s; on the machine without bf16 units 0.093 and 0.0096 TFLOP/s), as the stage does; the steps run at the rates the model reaches (`tflops`).

"""

# the CPU2 constants as fitted to the calibration run, whose jobs ran two at a time
CPU2_FITTED = replace(CPU2, alone=1.0)
REFERENCES = {
    "gpu": (H100, REFERENCE_JOBS, CALIBRATION_HEAD),
    "cpu": (CPU2_FITTED, CPU_JOBS, CPU_HEAD),
}


def calibration_markdown(config: dict, jobs_dir: Path | None = None) -> str:
    """Both machines' tables (`jobs_dir`: the H100's job log read from there instead)."""
    parts = []
    for preset, (dev, default_dir, head) in REFERENCES.items():
        d = jobs_dir if jobs_dir is not None and preset == "gpu" else default_dir
        rows, missing, extra = calibration(config, preset, dev, jobs_dir=d)
        lines = ["| stage | job | measured (s) | estimate (s) | estimate / measured |",
                 "|---|---|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {s} | {j} | {m:.0f} | {e:.0f} | {e / m:.2f} |" for s, j, m, e in rows]
        m, e = sum(r[2] for r in rows), sum(r[3] for r in rows)
        lines.append(
            f"| **all logged jobs** | {len(rows)} | **{m:.0f}** | **{e:.0f}** | {e / m:.2f} |"
        )
        if missing:
            lines += ["", "Planned, not in the job log (no `benchmark:` file): " +
                      ", ".join(missing) + "."]  # fmt: skip
        if extra:
            lines += ["", "In the job log, not planned by this config: " + ", ".join(extra) + "."]
        parts.append(head + "\n".join(lines) + "\n")
    return "\n".join(parts)
