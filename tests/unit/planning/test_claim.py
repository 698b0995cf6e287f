"""GPU jobs never share a GPU: planning/claim.py's claims, and the workflow on fake 1- and 4-GPU
machines (an nvidia-smi stub; the measuring stages replaced by a stand-in that records which
card it got and when), planned and run under `--cores 8`."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import pytest
from pipeline_utils import ROOT, copy_workflow, env_for, snakemake

from cs336_systems.planning import claim
from cs336_systems.planning.cores import parse_cpulist

H100 = "NVIDIA H100 80GB HBM3"


def cards(n: int) -> list[claim.Card]:
    """Cards of a pool set by index on a host whose GPUs nvidia-smi does not show (here)."""
    return [claim.Card(i) for i in range(n)]


def test_claims_take_free_cards_and_a_crash_frees_them(tmp_path):
    """A job holding a card (its process keeps the lock across exec) keeps others off it; when
    the job dies, even by SIGKILL, its card is free again."""
    env = {**os.environ, claim.LOCKS_ENV: str(tmp_path), claim.POOL_ENV: "0,1"}
    env.pop("SLURM_JOB_ID", None)
    holder = subprocess.Popen(
        [sys.executable, "-m", "cs336_systems.planning.claim", "1", "sh", "-c",
         'echo "$CUDA_VISIBLE_DEVICES $CS336_GPU_CLAIMED $CUDA_DEVICE_ORDER"; sleep 60'],
        env=env, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().split() == ["0", "0", "PCI_BUS_ID"]
        # card 0 is held: the next claim gets card 1, and a claim of both must wait
        assert claim.try_lock(tmp_path, cards(2)[0]) is None
        held = claim.claim(1, cards(2), tmp_path)
        assert [c.index for c, _ in held] == [1]
        for _, fd in held:
            os.close(fd)
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        # the shell is reaped first; its `sleep`, which inherited the lock, dies a moment
        # later (a loaded machine: tens of ms)
        deadline = time.monotonic() + 10
        while (fd := claim.try_lock(tmp_path, cards(2)[0])) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fd is not None, "a killed job's card stayed locked"
        os.close(fd)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)


def test_no_claim_without_gpus_under_slurm_or_when_switched_off(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(claim.SWITCH_ENV, raising=False)
    assert claim.wanted(1) and not claim.wanted(0)
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # SLURM gives each job its own GPUs
    assert not claim.wanted(1)
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv(claim.SWITCH_ENV, "off")
    assert not claim.wanted(1)
    installed = [claim.machine.Gpu(H100, f"GPU-{i}") for i in range(4)]
    assert claim.pool_from_env("", installed) == []
    assert claim.pool_from_env("1,3", installed) == [claim.Card(1, "GPU-1"), claim.Card(3, "GPU-3")]


# ---- the workflow on a fake GPU machine ------------------------------------------------------

# stands in for a measuring stage: records the card it got and when, writes its outputs
FAKE_STAGE = """
import json, os, sys, time
args = sys.argv[1:]
start = time.time()
# FAKE_SLEEP_<STAGE> (e.g. FAKE_SLEEP_ATTENTION) sets one stage's time
time.sleep(float(os.environ.get("FAKE_SLEEP_" + args[1].split(".")[-1].upper(), {seconds})))
with open({record!r}, "a") as f:
    f.write(json.dumps({{"stage": args[1], "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                         "cpu_set": os.environ.get("CS336_CPU_SET"),
                         "omp": os.environ.get("OMP_NUM_THREADS"),
                         "affinity": sorted(os.sched_getaffinity(0)),
                         "start": start, "end": time.time()}}) + "\\n")
for flag, value in zip(args, args[1:]):
    if flag == "--out" or flag.endswith("-out") or flag == "--junit":
        os.makedirs(os.path.dirname(value) or ".", exist_ok=True)
        open(value, "w").close()
"""
PYTHON_SHIM = """#!/bin/sh
if [ "$1" = "-m" ]; then
  # FAKE_REAL_ANALYSIS=1: the stages' analysis modules (figures) run as they are
  case "$2" in cs336_systems.stages.*.analysis) [ -n "$FAKE_REAL_ANALYSIS" ] && exec {python} "$@";; esac
  case "$2" in cs336_systems.stages.*) exec {python} {fake} "$@";; esac
fi
exec {python} "$@"
"""


def fake_machine(folder: Path, n_gpus: int, record: Path, seconds: float) -> dict:
    """The environment of a host with `n_gpus` H100s whose measuring stages are stand-ins."""
    folder.mkdir()
    smi = folder / "nvidia-smi"
    lines = [f"{H100}, 81559, GPU-fake-{i}" for i in range(n_gpus)]
    smi.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    fake = folder / "fake_stage.py"
    fake.write_text(FAKE_STAGE.format(seconds=seconds, record=str(record)))
    shim = folder / "python3"
    shim.write_text(PYTHON_SHIM.format(python=sys.executable, fake=fake))
    for exe in (smi, shim):
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    env = env_for(folder)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("SLURM_JOB_ID", None)
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    env["CS336_PYTHON"] = "python3"  # the rules run the shim, not Snakemake's interpreter
    env[claim.LOCKS_ENV] = str(folder / "locks")
    env[claim.machine.GPU_CHECK_ENV] = "off"  # the GPUs are fake: torch cannot use them
    return env


# the gpu preset's GPU jobs of ceilings, benchmark and attention: ceilings, 7 benchmark points,
# a warm-up sweep, 2 attention jobs
ALL_THREE = ("ceilings,benchmark,attention", ("benchmark", "benchmark_warmup", "attention"), 11)


def run_on_fake_gpus(
    tmp_path: Path, n_gpus: int, seconds: float, extra: tuple[str, ...] = (), which=ALL_THREE
) -> list[dict]:
    """Every GPU job of `which` (stages, the rules to run until, how many jobs), run under
    `--cores 8` on a fake `n_gpus`-GPU machine: [{stage, gpus, start, end}]. Snakemake's `gpu`
    resource (the default profile's count) keeps the GPU jobs at the GPUs: no job had to wait
    for a card."""
    stages, until, n_jobs = which
    work = copy_workflow(tmp_path / "wf")
    record = tmp_path / "gpu_jobs.jsonl"
    env = fake_machine(tmp_path / "bin", n_gpus, record, seconds)
    env["PYTHONPATH"] = f"{work / 'src'}{os.pathsep}{env['PYTHONPATH']}"
    proc = snakemake(
        work, "--cores", "8", "--config", f"stages=[{stages}]", "--until", *until, *extra,
        env=env, timeout=600,
    )  # fmt: skip
    provided = next(ln for ln in proc.stderr.splitlines() if ln.startswith("Provided resources"))
    assert f'gpu=Resource("gpu", {n_gpus})' in provided, provided
    jobs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(jobs) == n_jobs, jobs
    logs = [p.read_text() for p in (work / "results").rglob("logs/**/*.log")]
    assert len(logs) == n_jobs and not [text for text in logs if "free GPU(s) of" in text]
    return jobs


def overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def most_at_once(jobs: list[dict]) -> list[dict]:
    """The largest set of jobs running at one instant."""
    best: list[dict] = []
    for t in sorted(j["start"] for j in jobs):
        now = [j for j in jobs if j["start"] <= t < j["end"]]
        best = now if len(now) > len(best) else best
    return best


@pytest.mark.slow
def test_one_gpu_runs_one_measurement_at_a_time(tmp_path):
    # the two attention jobs, ready together: let run together, they would overlap
    jobs = run_on_fake_gpus(tmp_path, 1, seconds=0.5, which=("attention", ["attention"], 2))
    assert {j["gpus"] for j in jobs} == {"0"}
    together = [(a["stage"], b["stage"]) for a, b in combinations(jobs, 2) if overlap(a, b)]
    assert not together, f"GPU jobs ran together on one GPU: {together}"


@pytest.mark.slow
def test_four_gpus_run_four_measurements_at_once_each_alone_on_its_card(tmp_path):
    """Each on its card and its share of the cores (this host's cores split four ways: here
    2 cores, so `gpu_jobs=4` overrides the profile's one GPU job per 2 cores)."""
    jobs = run_on_fake_gpus(tmp_path, 4, seconds=2.0, extra=("--resources", "gpu=4", "gpu_jobs=4"))
    assert all(j["gpus"] in {"0", "1", "2", "3"} for j in jobs), jobs
    for a, b in combinations(jobs, 2):
        assert not (overlap(a, b) and a["gpus"] == b["gpus"]), (a, b)
    for j in jobs:  # pinned to the share its claim named, its thread pools sized to it
        assert j["cpu_set"] and j["affinity"] == parse_cpulist(j["cpu_set"]), j
        assert j["omp"] == str(len(j["affinity"])), j
    peak = most_at_once(jobs)
    assert len(peak) == 4, [(j["stage"], j["gpus"]) for j in peak]
    assert sorted(j["gpus"] for j in peak) == ["0", "1", "2", "3"]


@pytest.mark.slow
def test_a_stages_aggregate_runs_while_other_gpu_jobs_still_wait(tmp_path):
    """On a 2-GPU host under `--cores 2` (`gpu_jobs=2`: two GPU jobs at once on its 2 cores)
    the GPU jobs fill both core slots; the attention
    stage's aggregate (a light local job: no core slot on a GPU host) runs once its two short
    jobs end, before the last of the benchmark's queued jobs starts, not when the queue is
    empty (as it did while it waited for a slot)."""
    work = copy_workflow(tmp_path / "wf")
    record = tmp_path / "gpu_jobs.jsonl"
    env = fake_machine(tmp_path / "bin", 2, record, 1.5)
    env["PYTHONPATH"] = f"{work / 'src'}{os.pathsep}{env['PYTHONPATH']}"
    env.update(FAKE_SLEEP_ATTENTION="0.1", FAKE_SLEEP_CEILINGS="0.1")
    snakemake(
        work, "--cores", "2", "--config", "stages=[ceilings,benchmark,attention]",
        "--until", "benchmark", "benchmark_warmup", "attention_aggregate",
        "--resources", "gpu=2", "gpu_jobs=2", env=env, timeout=600,
    )  # fmt: skip
    jobs = [json.loads(line) for line in record.read_text().splitlines()]
    [aggregate] = (work / "results").glob("*/attention.csv")
    benchmark = [j for j in jobs if j["stage"].endswith((".benchmark", ".benchmark_warmup"))]
    assert len(benchmark) == 8, jobs
    assert aggregate.stat().st_mtime < max(j["start"] for j in benchmark)


def test_the_default_profile_provides_this_machines_gpu_count(tmp_path):
    """profiles/default gives Snakemake the visible GPUs' count as the `gpu` resource (none on
    a machine without GPUs); the measuring rules ask for it."""
    from snakemake.cli import parse_args

    env = fake_machine(tmp_path / "bin", 3, tmp_path / "unused.jsonl", 0)
    old_env, old_cwd = dict(os.environ), Path.cwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    claim.machine._installed.cache_clear()
    try:
        _, args = parse_args(["report"])
        assert args.resources["gpu"].value == 3
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        _, args = parse_args(["report"])
        assert "gpu" not in (args.resources or {})
    finally:
        os.environ.clear()
        os.environ.update(old_env)
        os.chdir(old_cwd)
        claim.machine._installed.cache_clear()


@pytest.mark.slow
def test_jobs_timed_on_the_cpu_never_run_beside_another(tmp_path):
    """On a host without GPUs, `--cores 2` runs no two measuring jobs at once (`timing`); with
    `timing=2` the same two jobs do run together (the check can fail)."""
    work = copy_workflow(tmp_path / "wf")
    record = tmp_path / "cpu_jobs.jsonl"
    env = fake_machine(tmp_path / "bin", 0, record, 1.0)
    env["PYTHONPATH"] = f"{work / 'src'}{os.pathsep}{env['PYTHONPATH']}"
    together = {}
    for extra in ((), ("--resources", "timing=2", "--forceall")):
        record.unlink(missing_ok=True)
        proc = snakemake(
            work, "--cores", "2", "--config", "preset=cpu", "stages=[ceilings,attention]",
            "--until", "ceilings", "attention", *extra, env=env, timeout=600,
        )  # fmt: skip
        provided = next(ln for ln in proc.stderr.splitlines() if ln.startswith("Provided res"))
        assert "timing=" in provided and "gpu=" not in provided, provided
        jobs = [json.loads(line) for line in record.read_text().splitlines()]
        assert len(jobs) == 2, jobs
        together[extra] = overlap(*jobs)
    assert together == {(): False, ("--resources", "timing=2", "--forceall"): True}, together


@pytest.mark.parametrize("gpus", [2, 0])
def test_light_jobs_share_quiet_and_a_gloo_job_holds_it_whole(tmp_path, gpus):
    """On a 2-GPU host and on one without GPUs the dry run gives each aggregate and plot one
    unit of `quiet` (they run beside each other and the GPU jobs) and no `timing`; the gloo
    all-reduce, timed on the CPU, holds `timing` and all of `quiet`; an NCCL job neither (on
    the CPU host it is a status row, and measures nothing)."""
    from cs336_systems.budget.forecast import dry_run_jobs

    work = copy_workflow(tmp_path / "wf")
    env = fake_machine(tmp_path / "bin", gpus, tmp_path / "unused.jsonl", 0)
    proc = snakemake(
        work, "-n", "--cores", "2", "--config", "preset=gpu", "edition=2025",
        "stages=[allreduce]", "-p", "--", "allreduce_plots", env=env, timeout=300,
    )  # fmt: skip
    jobs = {(j["rule"], j["wildcards"].get("backend", "")): j for j in dry_run_jobs(proc.stdout)}
    text = proc.stdout
    resources = {
        m.group(1): dict(kv.split("=") for kv in m.group(2).split(", "))
        for m in re.finditer(r"rule (\w+):\n(?:    .*\n)*?    resources: (.*)", text)
        if m.group(1) != "allreduce"
    }
    for light in ("allreduce_aggregate", "allreduce_plots"):
        assert resources[light]["quiet"] == "1" and resources[light].get("timing", "0") == "0"
        assert jobs[(light, "")]["light"] and not jobs[(light, "")]["alone"]
    gloo, nccl = jobs[("allreduce", "gloo")], jobs[("allreduce", "nccl")]
    assert gloo["alone"] and not gloo["light"] and not nccl["light"]
    assert nccl["alone"] == (gpus == 0)
    blocks = dict(re.findall(r"wildcards: backend=(\w+)\n(?:    .*\n)*?    resources: (.*)", text))
    assert "quiet=1000" in blocks["gloo"] and "timing=1" in blocks["gloo"], blocks
    if gpus:
        assert "quiet=0" in blocks["nccl"] and "timing=0" in blocks["nccl"], blocks


def test_a_plot_ready_while_every_core_holds_a_card_starts_at_once(tmp_path):
    """One GPU, `--cores 1`: when the attention jobs end, the next GPU job (the large
    benchmark point, 8 s) takes the one core with the attention aggregate beside it; the
    plots job, ready when the aggregate ends, starts then, not when the GPU job ends (Snakemake
    selects nothing while its cores are all taken: the cards count as `card_cores`)."""
    work = copy_workflow(tmp_path / "wf")
    record = tmp_path / "gpu_jobs.jsonl"
    env = fake_machine(tmp_path / "bin", 1, record, 0.1)
    env["PYTHONPATH"] = f"{work / 'src'}{os.pathsep}{env['PYTHONPATH']}"
    env.update(FAKE_SLEEP_BENCHMARK="8", FAKE_REAL_ANALYSIS="1")
    points = "results/fake1/benchmark/points"
    snakemake(
        work, "--cores", "1", "--config", "machine=fake1", "preset=gpu",
        "stages=[ceilings,benchmark,attention]", "--", "attention_plots",
        f"{points}/large_ctx512_naive.csv", env=env, timeout=600,
    )  # fmt: skip
    jobs = [json.loads(line) for line in record.read_text().splitlines()]
    order = [j["stage"].split(".")[-1] for j in sorted(jobs, key=lambda j: j["start"])]
    assert order == ["ceilings", "attention", "attention", "benchmark"], order
    large = next(j for j in jobs if j["stage"].endswith(".benchmark"))
    figures = sorted((work / "report" / "fake1" / "figures").glob("attention_*.png"))
    assert figures
    # the plots job ended while the GPU job still ran
    drawn = max(f.stat().st_mtime for f in figures)
    assert large["start"] < drawn < large["end"], (drawn, large)
