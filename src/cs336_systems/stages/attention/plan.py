"""The attention stage's knobs (`AttentionKnobs`, one per preset block of
config/stages/attention.yaml) and what the workflow needs to plan its jobs and check a block
beyond its schema (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts, head_dim_problem
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

Impl = Literal["naive_eager", "naive_compiled"]

# naive attention takes any d; the study compares it with the flash stage's kernels, whose
# head dims are multiples of 8 (SDPA's backends), so those are the ones worth measuring
MAX_HEAD_DIM = 256
POSITIVE = {"minItems": 1, "uniqueItems": True, "items": {"minimum": 1}}  # a list of sizes


@dataclass(frozen=True)
class AttentionKnobs(Knobs):
    """Naive attention eager vs compiled, head dim x length."""

    impls: list[Impl] = knob("the implementations (one job each)", minItems=1, uniqueItems=True)
    batch_size: int = knob("sequences of a point (one head)", minimum=1)
    head_dims: list[int] = knob("head dims d of the grid", **POSITIVE)
    seq_lens: list[int] = knob("sequence lengths n of the grid", **POSITIVE)
    causal: bool = knob("a causal mask")
    warmup_steps: int = knob("untimed forward+backward passes before a point's timings", minimum=0)
    fwd_steps: int = knob("timed forward passes of a point", minimum=1)
    bwd_steps: int = knob(
        "timed backward passes of a point (each after an untimed forward)", minimum=1
    )


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = AttentionKnobs


def point_files(k: AttentionKnobs, results: str) -> list[str]:
    """One CSV per implementation."""
    return [f"{results}/attention/points/{impl}.csv" for impl in k.impls]


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"attention": lambda w: w["impl"]}


def _point_s(k: AttentionKnobs, cost: Costs, d: int, n: int) -> float:
    """A point's passes: a forward is its two matmuls' FLOPs plus about 4 passes over the
    (n x n) fp32 scores, a backward twice the FLOPs and about 6 passes (fitted on the H100's
    naive_compiled job)."""
    fp32 = cost.rate("fp32")
    flops = 4.0 * k.batch_size * n * n * d
    scores = 4.0 * k.batch_size * n * n / (cost.dev.hbm_tbps * 1e12)
    fwd, bwd = flops / fp32 + 4 * scores, 2 * flops / fp32 + 6 * scores
    return k.fwd_steps * fwd + (k.warmup_steps + k.bwd_steps) * (fwd + bwd)


def estimate(k: AttentionKnobs, cost: Costs) -> list[Job]:
    """One job per implementation: its points' passes, and for a compiled one torch's
    automatic dynamic shapes (a static compile, then one dynamic one per head dim)."""
    jobs = []
    points = len(k.head_dims) * len(k.seq_lens)
    for impl in k.impls:
        run = sum(_point_s(k, cost, d, n) for d in k.head_dims for n in k.seq_lens)
        compiles = 1 + len(k.head_dims) if "compiled" in impl else 0
        setup = cost.dev.job_start_s + cost.dev.gpu_init_s + compiles * cost.dev.small_compile_s
        total = setup + run + points * 0.1
        jobs.append(Job("attention", impl, total, f"{points} points, {compiles} compiles"))
    return jobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    for i, d in enumerate(cfg["head_dims"]):
        if why := head_dim_problem(d, MAX_HEAD_DIM):
            at.fail(("head_dims", i), d, why)
