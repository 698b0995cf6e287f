"""The time budget of a preset: an estimate of every job the workflow plans, from the config.

    python -m cs336_systems.budget                       # every preset: logs the verdicts
    python -m cs336_systems.budget --out docs/budgets.md  # and writes the tables

Each job costs its process start, what it compiles, and its steps: FLOPs at a fraction of the
device's peak (`Device`), plus per-point overheads named in `Device` (do_bench windows, a
profiler capture, a memory snapshot). The numbers are estimates to plan with, not measurements:
the reference run's job log (results/<machine>/jobs/) is what to compare them with. A preset
whose sum is above its budget fails `check` (tests/test_budget.py keeps gpu under 25 minutes on
one H100 and cpu under 5 on 2 cores).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from cs336_systems.core import costs
from cs336_systems.core.config import load_yaml, with_stage_defaults
from cs336_systems.core.log import configure, get_logger
from cs336_systems.core.results import atomic_write_text
from cs336_systems.model import VOCAB_SIZE, size_spec
from cs336_systems.stages.benchmark import plan as benchmark_plan

ROOT = Path(__file__).resolve().parents[2]
log = get_logger(__name__)


@dataclass(frozen=True)
class Device:
    """What a job costs on one machine: rates and fixed costs, in seconds."""

    name: str
    # model matmul rates the steps reach: a fraction (`efficiency`) of the peak per precision
    peak_tflops: dict
    efficiency: float
    job_start_s: float  # python, import torch, CUDA context
    build_s_per_gparam: float  # building and moving a model to the device
    compile_s: float  # torch.compile of one model shape (size, context) in one precision
    small_compile_s: float  # torch.compile of an attention function
    triton_precompile_s: float  # our Triton kernels' variants, once per flash job
    capture_s: float  # one profiler capture and its export (nsys stats or torch.profiler)
    snapshot_s: float  # one memory snapshot written and read back
    point_s: float  # a flash point: correctness check, three do_bench windows
    gpus: int
    budget_s: float
    kernel_tests_s: float  # the kernels' pytest suite (the preset's selection, xdist workers)
    parallel: int  # jobs at once (snakemake --cores): the wall is the sum over this


H100 = Device(
    name="one H100 80GB (bf16 700, fp32 50 TFLOP/s at 40%)",
    peak_tflops={"bf16": 700.0, "fp32": 50.0},
    efficiency=0.4,
    job_start_s=8.0,
    build_s_per_gparam=4.0,
    compile_s=60.0,
    small_compile_s=10.0,
    triton_precompile_s=45.0,
    capture_s=15.0,
    snapshot_s=5.0,
    point_s=0.4,
    gpus=1,
    budget_s=25 * 60.0,
    kernel_tests_s=150.0,
    parallel=1,
)
# a 2-core CI machine: fp32 ~0.02 TFLOP/s reached; no bf16 units (the cost guard skips bf16)
CPU2 = Device(
    name="2 CPU cores (fp32 0.05 TFLOP/s at 40%, snakemake --cores 2)",
    peak_tflops={"bf16": 0.002, "fp32": 0.05},
    efficiency=0.4,
    job_start_s=4.0,
    build_s_per_gparam=20.0,
    compile_s=40.0,
    small_compile_s=20.0,
    triton_precompile_s=0.0,
    capture_s=3.0,
    snapshot_s=1.0,
    point_s=0.5,
    gpus=0,
    budget_s=5 * 60.0,
    # measured (2026-11-24, a shared 2-core machine): pytest's own 90 s for the cpu selection
    kernel_tests_s=90.0,
    parallel=2,
)
DEVICES = {"gpu": H100, "full": H100, "cpu": CPU2}


@dataclass
class Job:
    stage: str
    job: str
    seconds: float
    how: str
    parts: dict = field(default_factory=dict)


def _params(size: str) -> float:
    s = size_spec(size)
    return costs.param_count(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"])


def step_s(dev: Device, size: str, ctx: int, batch: int, mode: str, precision: str) -> float:
    s = size_spec(size)
    flops = costs.model_flops(
        VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"], batch, ctx, mode
    )
    return flops / (dev.peak_tflops.get(precision, dev.peak_tflops["fp32"]) * dev.efficiency * 1e12)


def _benchmark(cfg: dict, dev: Device) -> list[Job]:
    jobs = []
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    limit = cfg.get("max_point_s")
    for p in benchmark_plan.points(cfg):
        size, ctx = p["size"], p["context_length"]
        compiles = benchmark_plan.compile_arg(cfg, size, ctx, p["attention"]).split(",")
        c_modes = benchmark_plan.compile_filter(cfg, "modes").split(",")
        c_precs = benchmark_plan.compile_filter(cfg, "precisions").split(",")
        run = graphs = 0.0
        for comp in compiles:
            for prec in cfg["precisions"]:
                for mode in cfg["modes"]:
                    if comp == "compiled" and (mode not in c_modes or prec not in c_precs):
                        continue
                    t = steps * step_s(dev, size, ctx, cfg["batch_size"], mode, prec)
                    if limit and t > limit:
                        continue  # a `skipped:` row
                    run += t
        # about a minute per compiled model shape (size, context) and precision
        if "compiled" in compiles:
            graphs = len(c_precs)
        build = dev.build_s_per_gparam * _params(size) / 1e9
        total = dev.job_start_s + build + graphs * dev.compile_s + run
        jobs.append(
            Job(
                "benchmark",
                f"{size} ctx{ctx} {p['attention']}",
                total,
                f"{int(graphs)} compiled shapes, {run:.0f} s of steps",
            )  # fmt: skip
        )
    w = cfg["warmup_sweep"]
    for size in w["sizes"]:
        n = sum(x + w["measure_steps"] for x in w["warmups"])
        t = n * step_s(dev, size, w["context_length"], cfg["batch_size"], w["mode"], w["precision"])
        build = len(w["warmups"]) * dev.build_s_per_gparam * _params(size) / 1e9
        jobs.append(Job("benchmark", f"warm-up sweep {size}", dev.job_start_s + build + t,
                        f"{len(w['warmups'])} fresh models, {n} steps"))  # fmt: skip
    return jobs


def _memory(cfg: dict, dev: Device) -> list[Job]:
    jobs = []
    for size in cfg["sizes"]:
        run = 0.0
        points = 0
        for ctx in cfg["context_lengths"]:
            for mode in cfg["modes"]:
                for prec in cfg["precisions"]:
                    points += 1
                    run += (cfg["warmup_steps"] + 1) * step_s(dev, size, ctx, cfg["batch_size"],
                                                              mode, prec)  # fmt: skip
        build = dev.build_s_per_gparam * _params(size) / 1e9
        total = dev.job_start_s + build + run + points * dev.snapshot_s
        jobs.append(Job("memory", size, total, f"{points} snapshots"))
    return jobs


def _profile(cfg: dict, dev: Device) -> list[Job]:
    jobs = []
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    for size in cfg["sizes"]:
        run, points = 0.0, 0
        for ctx in cfg["context_lengths"]:
            for mode in cfg["modes"]:
                points += 1
                run += steps * step_s(dev, size, ctx, cfg["batch_size"], mode, cfg["precision"])
        build = dev.build_s_per_gparam * _params(size) / 1e9
        total = dev.job_start_s + points * (build + dev.capture_s) + run
        jobs.append(Job("profile", size, total, f"{points} captures"))
    return jobs


def _attention(cfg: dict, dev: Device) -> list[Job]:
    jobs = []
    steps = cfg["warmup_steps"] + cfg["fwd_steps"] + 2 * cfg["bwd_steps"]
    rate = dev.peak_tflops["fp32"] * dev.efficiency * 1e12
    for impl in cfg["impls"]:
        run = 0.0
        for d in cfg["head_dims"]:
            for n in cfg["seq_lens"]:
                run += steps * 4.0 * cfg["batch_size"] * n * n * d / rate
        # torch's automatic dynamic shapes: a static compile, then one dynamic one per head dim
        compiles = 1 + len(cfg["head_dims"]) if "compiled" in impl else 0
        points = len(cfg["head_dims"]) * len(cfg["seq_lens"])
        total = dev.job_start_s + compiles * dev.small_compile_s + run + points * 0.1
        jobs.append(Job("attention", impl, total, f"{points} points, {compiles} compiles"))
    return jobs


# loading our Triton kernels' variants from the run's cache (results/<machine>/.cache/triton)
CACHED_PRECOMPILE_S = 5.0


def _flash(cfg: dict, dev: Device, shared_cache: bool = True) -> list[Job]:
    """`shared_cache`: the kernel_tests stage ran first and precompiled into the run's cache."""
    jobs = []
    caps = cfg.get("max_seq_len", {})
    for dtype in cfg["dtypes"]:
        points = 0
        run = 0.0
        rate = dev.peak_tflops.get(dtype, dev.peak_tflops["fp32"]) * dev.efficiency * 1e12
        for impl in cfg["impls"]:
            for d in cfg["head_dims"]:
                for n in cfg["seq_lens"]:
                    if n > caps.get(impl, math.inf):
                        continue
                    points += 1
                    # fwd, bwd, fwd+bwd timed at least a few times each, plus the check
                    flops = 3.5 * 4.0 * cfg["batch_size"] * n * n * d / 2
                    slow = 10.0 if impl in ("naive_eager", "flash_pytorch") else 1.0
                    run += 8 * slow * flops / rate
        compiles = len(cfg["head_dims"]) * 2 if "naive_compiled" in cfg["impls"] else 0
        # the kernel_tests job compiled the variants into the run's shared Triton cache
        pre = dev.triton_precompile_s if "flash_triton" in cfg["impls"] else 0.0
        pre = min(pre, CACHED_PRECOMPILE_S) if shared_cache else pre
        total = dev.job_start_s + pre + compiles * dev.small_compile_s
        total += points * dev.point_s + run
        jobs.append(Job("flash", dtype, total, f"{points} points"))
    if cfg.get("leaderboard"):
        b = cfg["leaderboard"]
        per = 3 * (b.get("warmup_ms", 500) + b.get("rep_ms", 2000)) / 1e3
        pre = CACHED_PRECOMPILE_S if shared_cache else dev.triton_precompile_s
        total = dev.job_start_s + pre + len(b["impls"]) * per
        jobs.append(Job("flash", "leaderboard", total, f"{len(b['impls'])} implementations"))
    return jobs


def _checkpointing(cfg: dict, dev: Device) -> list[Job]:
    acc = cfg["accounting"]
    compiled = acc.get("compile_backend") == "inductor" and acc.get("device") != "meta"
    jobs = [Job("checkpointing", "accounting", dev.job_start_s + (dev.compile_s if compiled else 5),
                "one block, eager and compiled")]  # fmt: skip
    size, ctx, batch = cfg["size"], cfg["context_length"], cfg["batch_size"]
    layers = cfg.get("num_layers", size_spec(size)["num_layers"])
    scale = layers / size_spec(size)["num_layers"]
    steps = cfg["warmup_steps"] + cfg["measure_steps"]
    strategies = len(cfg["block_sizes"]) + len(cfg["nested"]) + 1  # and no checkpointing
    for prec in cfg["precisions"]:
        # recomputation: one more forward, 4/3 of a training step
        t = strategies * steps * 4 / 3 * scale * step_s(dev, size, ctx, batch, "train_step", prec)
        build = dev.build_s_per_gparam * _params(size) * scale / 1e9  # once per precision
        jobs.append(Job("checkpointing", prec, dev.job_start_s + build + t,
                        f"{strategies} strategies x {steps} steps"))  # fmt: skip
    return jobs


def _fixed(stage: str, seconds: float, how: str):
    return lambda cfg, dev: [Job(stage, stage, dev.job_start_s + seconds, how)]


def _distributed(stage: str, jobs_of):
    """One job per variant group (or backend): NCCL on fewer GPUs than its world size is status
    rows at once; gloo runs on the host's cores (a world of processes, ~30 s per world)."""

    def estimate(cfg: dict, dev: Device) -> list[Job]:
        jobs = []
        for name, backend, worlds in jobs_of(cfg):
            runs = [w for w in worlds if backend == "gloo" or w <= dev.gpus]
            how = f"{len(runs)} of {len(worlds)} world sizes run" + (
                "" if len(runs) == len(worlds) else f" (NCCL: {dev.gpus} GPUs here)"
            )
            jobs.append(Job(stage, name, dev.job_start_s + 30.0 * len(runs), how))
        return jobs

    return estimate


ESTIMATES = {
    "kernel_tests": lambda cfg, dev: [
        Job(
            "kernel_tests",
            "kernel_tests",
            dev.job_start_s + dev.kernel_tests_s,
            "the kernels' pytest suite, xdist workers",
        )
    ],  # fmt: skip
    "ceilings": _fixed("ceilings", 20.0, "matmuls per dtype and a copy"),
    "benchmark": _benchmark,
    "memory": _memory,
    "profile": _profile,
    "attention": _attention,
    "flash": _flash,
    "precision": _fixed("precision", 10.0, "the accumulation snippets"),
    "checkpointing": _checkpointing,
    "allreduce": _distributed(
        "allreduce", lambda cfg: [(b, b, cfg["world_sizes"]) for b in cfg["backends"]]
    ),
    "ddp": _distributed(
        "ddp",
        lambda cfg: [(j, cfg["backend"], [cfg["world_size"]]) for j in ("variants", "sharding")],
    ),
    "fsdp": _distributed("fsdp", lambda cfg: [("runs", cfg["backend"], [cfg["world_size"]])]),
}
# the aggregate, plot and report jobs: a process each, a few seconds
LOCAL_JOB_S = 3.0


def run_config(root: Path = ROOT) -> dict:
    config = load_yaml(root / "config" / "config.yaml")
    with_stage_defaults(config, root / "config" / "stages")
    return config


def plan(config: dict, preset: str, dev: Device) -> list[Job]:
    jobs = []
    for stage, estimate in ESTIMATES.items():
        if stage == "flash":
            estimate = partial(_flash, shared_cache="kernel_tests" in config)
        if stage in config and preset in config[stage]:
            jobs += estimate(config[stage][preset], dev)
    stages = [s for s in ESTIMATES if s in config]
    jobs.append(Job("(local)", "aggregates, plots, report", LOCAL_JOB_S * 2 * len(stages),
                    f"about {2 * len(stages)} short jobs"))  # fmt: skip
    return jobs


def check(jobs: list[Job], dev: Device) -> str:
    """'' when the jobs fit the device's budget, else why not."""
    total = sum(j.seconds for j in jobs) / dev.parallel
    if total <= dev.budget_s:
        return ""
    worst = sorted(jobs, key=lambda j: -j.seconds)[:3]
    return (
        f"estimated {total / 60:.1f} min, above the budget of {dev.budget_s / 60:.0f} min on "
        f"{dev.name}; the longest: "
        + "; ".join(f"{j.stage} {j.job} {j.seconds:.0f} s" for j in worst)
    )


def markdown(preset: str, jobs: list[Job], dev: Device) -> str:
    total = sum(j.seconds for j in jobs) / dev.parallel
    by_stage: dict[str, float] = {}
    for j in jobs:
        by_stage[j.stage] = by_stage.get(j.stage, 0.0) + j.seconds
    lines = [
        f"### preset `{preset}` on {dev.name}: {total / 60:.1f} min estimated, "
        + (
            "no budget (the handout's whole grid)"
            if preset == "full"
            else f"budget {dev.budget_s / 60:.0f} min"
        )
        + (
            f" ({dev.parallel} jobs at once: the sum over {dev.parallel})"
            if dev.parallel > 1
            else ""
        ),
        "",
        "| stage | job | estimate (s) | what it costs |",
        "|---|---|---:|---|",
    ]
    lines += [f"| {j.stage} | {j.job} | {j.seconds:.0f} | {j.how} |" for j in jobs]
    lines += ["", "| stage | total (s) |", "|---|---:|"]
    lines += [f"| {s} | {t:.0f} |" for s, t in by_stage.items()]
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Time budgets of the presets

Written by `python -m cs336_systems.budget --out docs/budgets.md` from the config (every job the
workflow plans, its estimate and what it costs; the model and constants are in
`src/cs336_systems/budget.py`). `tests/test_budget.py` fails when a preset's estimate is above its
budget or this file is stale. Estimates to plan with: the reference run's job log
(`results/<machine>/jobs/`) says what each job took.

"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", choices=sorted(DEVICES), action="append")
    ap.add_argument("--out", help="write the tables here (markdown)")
    args = ap.parse_args(argv)
    configure("budget")
    text, failed = document(args.preset or ["cpu", "gpu", "full"])
    for line in failed:
        log.error("%s", line)
    if args.out:
        atomic_write_text(args.out, text)
        log.info("wrote %s", args.out)
    return 1 if failed else 0


def document(presets: list[str], root: Path = ROOT) -> tuple[str, list[str]]:
    """The budget tables of `presets` and the over-budget verdicts (full has no budget: it is
    the handout's whole grid)."""
    parts, failed = [DOC_HEAD], []
    config = run_config(root)
    for preset in presets:
        dev = DEVICES[preset]
        jobs = plan(config, preset, dev)
        parts.append(markdown(preset, jobs, dev))
        why = check(jobs, dev)
        if why and preset != "full":
            failed.append(f"preset {preset}: {why}")
        parts.append("\n")
    return "".join(parts).rstrip("\n") + "\n", failed


if __name__ == "__main__":
    raise SystemExit(main())
