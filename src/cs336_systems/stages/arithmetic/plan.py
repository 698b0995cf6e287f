"""The arithmetic stage's knobs (`ArithmeticKnobs`, one per preset block of
config/stages/arithmetic.yaml) and what the workflow needs to plan and check the stage (no
torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.estimate import Costs, EtaKeys, Job, fixed_job
from cs336_systems.planning.knobs import Knobs, knob

POSITIVE = {"exclusiveMinimum": 0}
PAIR = {"minItems": 2, "maxItems": 2, "items": {"minimum": 1}}  # [a, b], each at least 1


@dataclass(frozen=True)
class Shape(Knobs):
    """One FFN: x is (tokens, d_model); W1, W2: (d_model, d_ff); W3: (d_ff, d_model)."""

    name: str = knob(
        "the shape's name (keys the rows)",
        pattern="^[A-Za-z0-9._-]+$",
        allowed="letters, digits, . _ -",
    )
    tokens: int = knob("tokens per step, the handout's B", minimum=1)
    d_model: int = knob("model width", minimum=1)
    d_ff: int = knob("FFN width", minimum=1)


@dataclass(frozen=True)
class B200(Knobs):
    """The handout's B200."""

    tflops: float = knob("C: matmul TFLOP/s (the handout's FP16 figure)", **POSITIVE)
    egress_gbps: float = knob(
        "W: egress GB/s per GPU and direction (not in the handout)", **POSITIVE
    )


@dataclass(frozen=True)
class Xxl(Knobs):
    """The 2025 handout's XXL model (communication_accounting)."""

    d_model: int = knob("model width", minimum=1)
    d_ff: int = knob("FFN width", minimum=1)
    blocks: int = knob("blocks of two linears", minimum=1)


@dataclass(frozen=True)
class Tpu(Knobs):
    """The 2025 handout's TPU v5p."""

    tflops: float = knob("C: matmul TFLOP/s", **POSITIVE)
    ici_gbps: float = knob("W_ici: GB/s of one ICI link", **POSITIVE)
    hbm_gb: float = knob("HBM GB of one chip", **POSITIVE)
    mesh: list[int] = knob("[X, Y]: the FSDP and the TP axis of the mesh", **PAIR)
    axes: list[int] = knob(
        "[M_X, M_Y]: physical axes each logical axis spans (bandwidth multiples)", **PAIR
    )


@dataclass(frozen=True)
class Measured(Knobs):
    """Which rows of the ceilings and allreduce stages' CSVs stand for this machine."""

    dtypes: list[Literal["fp16", "bf16", "tf32", "fp32"]] = knob(
        "C: the first of these measured by the ceilings stage", minItems=1, uniqueItems=True
    )
    backends: list[Literal["gloo", "nccl"]] = knob(
        "W: the best bus bandwidth of each (one case per backend)", minItems=1, uniqueItems=True
    )


@dataclass(frozen=True)
class Activation(Knobs):
    """memory_profiling (d): one residual-stream activation of the edition's model, derived."""

    size: str = knob("the model size the handout names (2026: xl; 2025: 2.7B)")
    batch_size: int = knob("the reference batch size", minimum=1)
    context_lengths: list[int] = knob(
        "context lengths evaluated (the reference 512 and the memory questions' own)",
        minItems=1,
        uniqueItems=True,
        items={"minimum": 1},
    )


@dataclass(frozen=True)
class ArithmeticKnobs(Knobs):
    """The 2026 communication arithmetic and the 2025 communication accounting, evaluated."""

    shapes: list[Shape] = knob("the FFN shapes evaluated", minItems=1)
    devices: list[int] = knob(
        "N at which the times are evaluated", minItems=1, uniqueItems=True, items={"minimum": 2}
    )
    splits: list[list[int]] = knob(
        "[N_FSDP, N_TP] of the 2-D problem's times", minItems=1, uniqueItems=True, items=PAIR
    )
    message_mb: float = knob("S of the alternate ring all-reduce (MB)", **POSITIVE)
    b200: B200 = knob("the handout's B200")
    xxl: Xxl = knob("the 2025 handout's XXL model")
    tpu: Tpu = knob("the 2025 handout's TPU v5p and mesh")
    h100_gb: float = knob("GB of an H100 (the accounting's memory comparison)", **POSITIVE)
    measured: Measured = knob("this machine's case: C and W from the measuring stages' CSVs")
    activation: Activation = knob("memory_profiling (d): the edition's model, derived")


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = ArithmeticKnobs

# the other stages' CSVs the stage reads, when those stages run: {option: (stage, file)}
SOURCES = {"ceilings": ("ceilings", "ceilings.csv"), "allreduce": ("allreduce", "allreduce.csv")}


def inputs(stages: list[str], results: str) -> dict[str, str]:
    """{option: path} of the input CSVs whose stages are in this run (the rule's inputs)."""
    return {opt: f"{results}/{name}" for opt, (stage, name) in SOURCES.items() if stage in stages}


def input_args(paths: dict[str, str]) -> str:
    """The CLI options naming the input CSVs (an absent one is reported as missing)."""
    return " ".join(f"--{opt} {path}" for opt, path in sorted(paths.items()))


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"arithmetic": lambda w: "arithmetic"}


def estimate(k: ArithmeticKnobs, cost: Costs) -> list[Job]:
    """Arithmetic on the ceilings' and allreduce's CSVs: seconds whatever the block says."""
    return [fixed_job("arithmetic", cost, "arithmetic on the ceilings' and allreduce's CSVs")]


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """Shape names are unique (they key the rows); a split of at least two devices; the
    activation's model is one of the edition's sizes."""
    names = [s["name"] for s in cfg["shapes"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            at.fail(("shapes", i, "name"), name, "a name no other shape has (it keys the rows)")
    at.sizes(("activation", "size"), cfg["activation"]["size"], facts)
    for i, (f, t) in enumerate(cfg["splits"]):
        if f * t < 2:
            at.fail(("splits", i), [f, t], "N_FSDP x N_TP of at least 2 devices")
