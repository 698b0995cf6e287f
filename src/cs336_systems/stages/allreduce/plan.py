"""The allreduce stage's knobs (`AllreduceKnobs`, one per preset block of
config/stages/allreduce.yaml) and what the workflow checks in a block beyond its schema
(no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts, check_launcher
from cs336_systems.planning.estimate import Costs, EtaKeys, Job, world_jobs
from cs336_systems.planning.knobs import Env, Knobs, Launcher, knob

# every rank holds the reference, its contribution and the buffer it all-reduces
BUFFERS_PER_RANK = 3
# the grid each handout's distributed_communication_single_node asks for: its backends, float32
# messages of 1 MB to 1 GB (MiB to GiB here) and 2, 4 and 6 processes
HANDOUT_GRID = {
    2025: {"backends": ("gloo", "nccl"), "sizes_mb": (1, 10, 100, 1024), "world_sizes": (2, 4, 6)},
    2026: {"backends": ("nccl",), "sizes_mb": (1, 10, 100, 1024), "world_sizes": (2, 4, 6)},
}


def _sizes(backend: str):
    return knob(
        f"{backend}'s float32 message sizes in MiB (2**20 bytes)",
        minItems=1,
        uniqueItems=True,
        items={"exclusiveMinimum": 0},
    )


@dataclass(frozen=True)
class SizesMb(Knobs):
    """The message sizes each backend times."""

    gloo: list[float] = _sizes("gloo")
    nccl: list[float] = _sizes("nccl")


@dataclass(frozen=True)
class AllreduceKnobs(Knobs):
    """All-reduce time and bandwidth per backend, world size and message size."""

    backends: list[Literal["gloo", "nccl"]] = knob(
        "the backends timed, one job each", minItems=1, uniqueItems=True
    )
    world_sizes: list[int] = knob(
        "ranks of each launch (those the machine cannot run give skipped rows)",
        minItems=1,
        uniqueItems=True,
        items={"minimum": 2},
    )
    sizes_mb: SizesMb = knob("message sizes per backend")
    nccl_buffers: list[Literal["default", "registered"]] = knob(
        "NCCL only: registered also times buffers registered with the communicator",
        minItems=1,
        uniqueItems=True,
    )
    warmup: int = knob("most warm-up all-reduces per size", minimum=1)
    repeats: int = knob("most timed samples per size", minimum=1)
    min_repeats: int = knob("fewest timed samples per size", minimum=1)
    max_seconds_per_size: float = knob(
        "the timing budget per size that picks between them", exclusiveMinimum=0
    )
    sample_ms: float = knob("one sample's length: back-to-back all-reduces", exclusiveMinimum=0)
    env: Env = knob("variables set for every rank")
    launcher: Launcher = knob("how the ranks start")
    timeout_s: float = knob("seconds a launch may take", exclusiveMinimum=0)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = AllreduceKnobs


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"allreduce": lambda w: w["backend"]}


def estimate(k: AllreduceKnobs, cost: Costs) -> list[Job]:
    """One job per backend, a world per world size (NCCL's beyond this host's GPUs: status
    rows at once)."""
    return world_jobs("allreduce", cost, [(b, b, list(k.world_sizes)) for b in k.backends])


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.at_most("min_repeats", cfg["min_repeats"], "repeats", cfg["repeats"])
    at.env("env", cfg["env"])
    check_launcher(at, cfg["launcher"])
    # message sizes that cannot fit on this machine even at the smallest world size
    ranks = math.ceil(min(cfg["world_sizes"]) / cfg["launcher"]["nnodes"])
    memory = {
        "gloo": (facts.host_memory_mib, BUFFERS_PER_RANK * ranks, "this host"),
        "nccl": (facts.gpu_memory_mib, BUFFERS_PER_RANK, "one GPU"),
    }
    for backend in cfg["backends"]:
        have, copies, where = memory[backend]
        for i, mb in enumerate(cfg["sizes_mb"][backend]):
            at.fits(("sizes_mb", backend, i), mb, copies * mb, have, where)
