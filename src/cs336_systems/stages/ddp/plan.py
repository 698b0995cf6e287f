"""The ddp stage's knobs (`DdpKnobs`, one per preset block of config/stages/ddp.yaml) and what the
workflow checks in a block beyond its schema (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts, check_launcher
from cs336_systems.planning.estimate import Costs, EtaKeys, Job, world_jobs
from cs336_systems.planning.knobs import Env, Knobs, Launcher, knob

Variant = Literal["naive", "flat", "overlap", "bucketed", "torch_ddp"]
# the model both handouts' DDP and sharding parts ask for, by its name in the edition's own
# table: 2026's xl (2560/10240/32 layers/32 heads), 2025's XL (1600/6400/48/25)
HANDOUT_SIZE = "xl"


@dataclass(frozen=True)
class DdpKnobs(Knobs):
    """Training steps with each DDP variant against a compute-only step, and optimizer-state
    sharding, at one model size, context and batch per rank."""

    backend: Literal["gloo", "nccl"] = knob("gloo on CPU processes, nccl on GPUs")
    world_size: int = knob("ranks of each run", minimum=2)
    size: str = knob("a model size name (checked against the edition's table)")
    context_length: int = knob("tokens per sequence", minimum=1)
    batch_per_rank: int = knob("sequences per rank and step", minimum=1)
    variants: list[Variant] = knob(
        "the DDP variants run, torch_ddp being PyTorch's own (25 MiB buckets)",
        minItems=1,
        uniqueItems=True,
    )
    bucket_sizes_mb: list[float] = knob(
        "bucket sizes of the bucketed variant (MiB)",
        minItems=1,
        uniqueItems=True,
        items={"exclusiveMinimum": 0},
    )
    warmup_steps: int = knob("steps run before the measured ones", minimum=0)
    measure_steps: int = knob("steps measured", minimum=1)
    sharding: bool = knob("also run the optimizer-state sharding job")
    profile: bool = knob("profile one step of naive, overlap and the best bucketed run")
    matmul_precision: Literal["highest", "high", "medium"] = knob(
        "torch.set_float32_matmul_precision (highest: no TF32)"
    )
    env: Env = knob("variables set for every rank")
    launcher: Launcher = knob("how the ranks start")
    timeout_s: float = knob("seconds a launch may take", exclusiveMinimum=0)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = DdpKnobs


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"ddp": lambda w: w["kind"]}


def estimate(k: DdpKnobs, cost: Costs) -> list[Job]:
    """The variants and the sharding job (a world each); where NCCL has fewer GPUs than the
    world, the variants job still measures its compute-only baseline in one process."""
    jobs = world_jobs(
        "ddp", cost, [(j, k.backend, [k.world_size]) for j in ("variants", "sharding")]
    )
    if k.backend == "nccl" and 1 <= cost.dev.gpus < k.world_size:
        steps = k.warmup_steps + k.measure_steps
        step = cost.step_s(k.size, k.context_length, k.batch_per_rank, "train_step", "fp32")
        base = cost.dev.job_start_s + cost.build_s(k.size) + steps * step
        v = jobs[0]
        jobs[0] = Job(v.stage, v.job, v.seconds + base, f"{v.how}; the baseline on one GPU")
    return jobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("size", cfg["size"], facts)
    at.env("env", cfg["env"])
    check_launcher(at, cfg["launcher"])
    nnodes = cfg["launcher"]["nnodes"]
    if cfg["world_size"] % nnodes:
        at.fail(
            "world_size",
            cfg["world_size"],
            f"a multiple of launcher.nnodes ({nnodes}): as many ranks on every node",
        )
