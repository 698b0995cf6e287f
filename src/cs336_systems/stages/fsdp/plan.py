"""The fsdp stage's knobs (`FsdpKnobs`, one per preset block of config/stages/fsdp.yaml) and what
the workflow checks in a block beyond its schema (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.estimate import Costs, EtaKeys, Job, world_jobs
from cs336_systems.planning.knobs import Env, Knobs, knob

# the variants, in the order a run measures them (measure.py's docstring says what each is)
Variant = Literal[
    "ddp",
    "ddp_bf16",
    "sharded_optimizer",
    "fsdp",
    "fsdp_bf16",
    "fsdp_layer",
    "fsdp_bf16_layer",
    "ddp_bf16_compiled",
    "fsdp_bf16_compiled",
    "ddp_bf16_graphed",
    "fsdp_bf16_graphed",
    "torch_fsdp_bf16",
    "torch_fsdp_bf16_compiled",
]


@dataclass(frozen=True)
class FsdpKnobs(Knobs):
    """DDP, DDP + sharded optimizer and FSDP on one model: memory per rank, time per step,
    communication and the all-gather time compute hides."""

    backend: Literal["gloo", "nccl"] = knob("gloo on CPU processes, nccl on GPUs")
    world_size: int = knob("ranks of the run", minimum=2)
    size: str = knob("a model size name (checked against the edition's table)")
    context_length: int = knob("tokens per sequence", minimum=1)
    batch_per_rank: int = knob("sequences per rank and step", minimum=1)
    variants: list[Variant] = knob(
        "the variants run, torch_fsdp_* being PyTorch's FSDP2", minItems=1, uniqueItems=True
    )
    warmup_steps: int = knob("steps run before the measured ones", minimum=0)
    measure_steps: int = knob("steps measured", minimum=1)
    profile: bool = knob("profile one step per variant (the overlap)")
    matmul_precision: Literal["highest", "high", "medium"] = knob(
        "torch.set_float32_matmul_precision (highest: no TF32)"
    )
    env: Env = knob("variables set for every rank")
    timeout_s: float = knob("seconds the launch may take", exclusiveMinimum=0)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = FsdpKnobs


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"fsdp": lambda w: "runs"}


def estimate(k: FsdpKnobs, cost: Costs) -> list[Job]:
    """One world running every variant (status rows at once where NCCL lacks the GPUs)."""
    return world_jobs("fsdp", cost, [("runs", k.backend, [k.world_size])])


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("size", cfg["size"], facts)
    at.env("env", cfg["env"])
