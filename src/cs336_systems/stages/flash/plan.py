"""The flash stage's knobs (`FlashKnobs`, one per preset block of config/stages/flash.yaml) and
what the workflow needs to plan the stage's jobs from a block."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts, head_dim_problem
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

# our Triton kernel's largest head dim (kernels/triton/common.py:MAX_HEAD_DIM; a test keeps them
# equal); SDPA's CUDA backends need multiples of 8
MAX_HEAD_DIM = 128

IMPLS = (
    "naive_eager", "naive_compiled", "flash_pytorch", "flash_triton", "sdpa_flash", "sdpa_cudnn",
    "sdpa_efficient",
)  # fmt: skip
Impl = Literal[
    "naive_eager", "naive_compiled", "flash_pytorch", "flash_triton", "sdpa_flash", "sdpa_cudnn",
    "sdpa_efficient",
]  # fmt: skip
Dtype = Literal["fp32", "bf16", "fp16"]
# SDPA's CUDA backends with kernels for some dtypes only: torch's
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp lets `can_use_flash_attention` and
# `can_use_cudnn_attention` take fp16 and bf16 alone (so pinned to one of them, an fp32 call
# fails with "No available kernel"); the memory-efficient backend also takes fp32
SDPA_CUDA_DTYPES = {"sdpa_flash": ("fp16", "bf16"), "sdpa_cudnn": ("fp16", "bf16")}


def no_kernel(impl: str, dtype: str) -> str:
    """Why `impl` cannot run in `dtype` on CUDA (a `skipped:` status), '' where it can."""
    dtypes = SDPA_CUDA_DTYPES.get(impl)
    if dtypes is None or dtype in dtypes:
        return ""
    return f"skipped: SDPA's {impl.removeprefix('sdpa_')} backend has no {dtype} kernel (only {', '.join(dtypes)})"


SET = {"minItems": 1, "uniqueItems": True}
HEAD_DIMS = {**SET, "items": {"minimum": 1, "maximum": MAX_HEAD_DIM}}
LENGTHS = {**SET, "items": {"minimum": 1}}
WINDOW = {"exclusiveMinimum": 0}


@dataclass(frozen=True)
class Timing(Knobs):
    """do_bench's windows and the steps around them."""

    warmup_steps: int = knob("calls before the timed ones", minimum=0)
    steps: int = knob("timed calls (CPU) or runs", minimum=1)
    warmup_ms: float = knob("do_bench's warm-up window (ms)", **WINDOW)
    rep_ms: float = knob("do_bench's measurement window (ms)", **WINDOW)


@dataclass(frozen=True)
class Target(Knobs):
    """Our kernel's fixed-cost target: ours against SDPA cuDNN at short lengths, with
    many heads; rows grid=target."""

    impls: list[Impl] = knob("the implementations", **SET)
    dtype: Dtype = knob("their dtype")
    batch_size: int = knob("batch", minimum=1)
    heads: int = knob("attention heads", minimum=1)
    head_dims: list[int] = knob("head dims", **HEAD_DIMS)
    seq_lens: list[int] = knob("sequence lengths", **LENGTHS)
    warmup_ms: float | None = knob(
        "do_bench windows (ms); the sweep's timing otherwise", default=None, **WINDOW
    )
    rep_ms: float | None = knob(
        "do_bench windows (ms); the sweep's timing otherwise", default=None, **WINDOW
    )
    rounds: int = knob(
        "after each point, forward+backward of the implementations timed again back to back in"
        " this many rounds (rounds.py); the target is judged on the rounds' median ratio, on the"
        " single windows' ratio with 0",
        default=0,
        minimum=0,
    )


@dataclass(frozen=True)
class Leaderboard(Knobs):
    """The leaderboard point: one length, one head dim, many heads."""

    impls: list[Impl] = knob("the implementations", **SET)
    dtype: Dtype = knob("their dtype")
    batch_size: int = knob("batch", minimum=1)
    heads: int = knob("attention heads", minimum=1)
    seq_len: int = knob("sequence length", minimum=1)
    head_dim: int = knob("head dim", minimum=1, maximum=MAX_HEAD_DIM)
    warmup_ms: float | None = knob(
        "do_bench windows (ms); the sweep's timing otherwise", default=None, **WINDOW
    )
    rep_ms: float | None = knob(
        "do_bench windows (ms); the sweep's timing otherwise", default=None, **WINDOW
    )


@dataclass(frozen=True)
class FlashKnobs(Knobs):
    """Causal attention implementations over length x head dim x dtype, the fixed-cost target
    and the leaderboard point."""

    impls: list[Impl] = knob("the implementations swept", **SET)
    dtypes: list[Dtype] = knob("one sweep job per dtype", **SET)
    batch_size: int = knob("batch", minimum=1)
    head_dims: list[int] = knob("head dims", **HEAD_DIMS)
    seq_lens: list[int] = knob("sequence lengths", **LENGTHS)
    max_seq_len: dict[str, int | dict[str, int]] = knob(
        "per implementation: the longest n it runs, or that per dtype ({fp32: 16384})",
        propertyNames={"type": "string", "enum": list(IMPLS)},
        additionalProperties={
            "oneOf": [
                {"type": "integer", "minimum": 1},
                {"type": "object", "minProperties": 1,
                 "propertyNames": {"type": "string", "enum": ["fp32", "bf16", "fp16"]},
                 "additionalProperties": {"type": "integer", "minimum": 1}},
            ]
        },
    )  # fmt: skip
    flash_pytorch_tiles: list[int] = knob(
        "the PyTorch FA2's tiles (q, k)", minItems=2, maxItems=2, items={"minimum": 16}
    )
    fp32_matmul_precision: Literal["highest", "high"] = knob(
        "torch.set_float32_matmul_precision (highest: no TF32)"
    )
    timing: Timing = knob("do_bench's windows and steps")
    target: Target | None = knob("the fixed-cost target's points", default=None)
    leaderboard: Leaderboard | None = knob("the leaderboard point", default=None)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = FlashKnobs
# what each job reads: the timing, caps, tiles and precision every job shares, and its own grid
# (a dtype's sweep: the sweep's axes; the target's and the leaderboard's: their blocks). A value
# only other jobs read leaves a job as it was.
SHARED = ("max_seq_len", "flash_pytorch_tiles", "fp32_matmul_precision", "timing")
SWEEP_KNOBS = FlashKnobs.part("impls", "batch_size", "head_dims", "seq_lens", *SHARED)
TARGET_KNOBS = FlashKnobs.part("target", *SHARED)
LEADERBOARD_KNOBS = FlashKnobs.part("leaderboard", *SHARED)


def gate(stages: list[str], results: str) -> list[str]:
    """The kernel tests' CSV when that stage runs (it then gates our kernels), else nothing."""
    return [f"{results}/kernel_tests.csv"] if "kernel_tests" in stages else []


def gate_arg(gate_file: str) -> str:
    return f"--kernel-tests {gate_file}" if gate_file else ""


def seq_cap(caps: dict, impl: str, dtype: str) -> float:
    """The longest n `impl` runs in `dtype` under `max_seq_len` ({impl: n} or {impl: {dtype: n}});
    inf where nothing caps it."""
    cap = caps.get(impl, math.inf)
    return cap.get(dtype, math.inf) if isinstance(cap, dict) else cap


# the sweep's heads (the handout's: one); the target's and the leaderboard's are knobs
SWEEP_HEADS = 1


def job_settings(job: str, knobs) -> dict:
    """What a job runs, from its part of the block (`SWEEP_KNOBS`, `TARGET_KNOBS`,
    `LEADERBOARD_KNOBS`): the sweep its axes; the target and the leaderboard their own points
    and do_bench windows, where given (they replace the sweep's)."""
    t = knobs.timing
    out = {
        "grid": job,
        "max_seq_len": dict(knobs.max_seq_len),
        "flash_tiles": list(knobs.flash_pytorch_tiles),
        "fp32_matmul_precision": knobs.fp32_matmul_precision,
        "warmup_ms": float(t.warmup_ms),
        "rep_ms": float(t.rep_ms),
        "warmup_steps": t.warmup_steps,
        "steps": t.steps,
        "rounds": 0,  # the target's paired rounds
    }
    if job == "sweep":
        out.update(impls=list(knobs.impls), batch_size=knobs.batch_size, heads=SWEEP_HEADS)
        return {**out, "head_dims": list(knobs.head_dims), "seq_lens": list(knobs.seq_lens)}
    own = knobs.target if job == "target" else knobs.leaderboard
    if job == "target":
        out.update(head_dims=list(own.head_dims), seq_lens=list(own.seq_lens), rounds=own.rounds)
    else:
        out.update(head_dims=[own.head_dim], seq_lens=[own.seq_len])
    for key in ("warmup_ms", "rep_ms"):
        if getattr(own, key) is not None:
            out[key] = float(getattr(own, key))
    out.update(impls=list(own.impls), dtype=own.dtype, batch_size=own.batch_size)
    return {**out, "heads": own.heads}


def point_files(k: FlashKnobs, results: str) -> list[str]:
    """One CSV per dtype of the sweep, the target's and the leaderboard's where configured."""
    files = [f"{results}/flash/points/{dtype}.csv" for dtype in k.dtypes]
    files += [f"{results}/flash/target.csv"] if k.target else []
    return files + ([f"{results}/flash/leaderboard.csv"] if k.leaderboard else [])


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {
    "flash": lambda w: w["dtype"],
    "flash_target": lambda w: "target",
    "flash_leaderboard": lambda w: "leaderboard",
}
# the leaderboard job's correctness check (H100: 12 s an implementation with its windows)
LEADERBOARD_CHECK_S = 4.5
# forward+backward runs a flash point times (H100 naive_eager bf16 n=65536: 2.5 s at 100 ms)
NAIVE_REPS = 25
# loading our Triton kernels' variants from the run's cache (results/<machine>/.cache/triton)
CACHED_PRECOMPILE_S = 5.0
# our Triton kernel in fp32 at `highest` precision (no TF32) runs on the CUDA cores: 6.6 TFLOP/s
# against the 42 of TF32 matmuls on the H100 (d = 128, n = 16384: 36 ms, reference run of 80334dd)
FP32_KERNEL_SHARE = 0.16
# a new length's autotuning times each candidate tile a few times: about 70 forward+backward
# steps a point (the four fp32 points at n = 65536: 75 s for 1.1 s of steps, run of 80334dd)
TUNE_STEPS = 70


def _sweep_point_s(k: FlashKnobs, cost: Costs, impl: str, dtype: str, d: int, n: int) -> float:
    """A sweep point's seconds beside the per-point overhead: an SDPA backend without a kernel
    for the dtype (`no_kernel`) is a `skipped` row, not run; naive attention's (n x n) scores an `oom` row above about 5 copies of them, else a
    forward+backward about 30 passes over them; the flash kernels fwd, bwd and fwd+bwd a few
    times each, and the check; our Triton kernel also its autotuning at each new length (at
    the CUDA cores' rate in fp32 without TF32)."""
    if no_kernel(impl, dtype):
        return 0.0
    if impl.startswith("naive"):
        scores = k.batch_size * n * n * (2 if dtype == "bf16" else 4)
        if cost.dev.memory_gib and 5 * scores > cost.dev.memory_gib * 2**30:
            return 0.0
        return NAIVE_REPS * 30 * scores / (cost.dev.hbm_tbps * 1e12)
    flops = 3.5 * 4.0 * k.batch_size * n * n * d / 2
    if impl == "flash_triton":
        share = FP32_KERNEL_SHARE if (dtype, k.fp32_matmul_precision) == ("fp32", "highest") else 1
        return (8 + TUNE_STEPS) * flops / (share * cost.rate(dtype))
    slow = 10.0 if impl == "flash_pytorch" else 1.0
    return 8 * slow * flops / cost.rate(dtype)


def _precompile_s(k: FlashKnobs, cost: Costs) -> float:
    """Our Triton kernels' variants, compiled by the kernel_tests job into the run's shared
    cache where that stage runs (then only loaded)."""
    shared = "kernel_tests" in cost.stages
    pre = cost.dev.triton_precompile_s if "flash_triton" in k.impls else 0.0
    return min(pre, CACHED_PRECOMPILE_S) if shared else pre


def _sweep_jobs(k: FlashKnobs, cost: Costs) -> list[Job]:
    jobs = []
    caps = k.max_seq_len or {}
    for dtype in k.dtypes:
        points, run = 0, 0.0
        for impl, d, n in itertools.product(k.impls, k.head_dims, k.seq_lens):
            if n > seq_cap(caps, impl, dtype):
                continue
            points += 1
            run += _sweep_point_s(k, cost, impl, dtype, d, n)
        compiles = len(k.head_dims) * 2 if "naive_compiled" in k.impls else 0
        pre = _precompile_s(k, cost)
        setup = cost.dev.job_start_s + cost.dev.flash_setup_s + pre
        total = setup + compiles * cost.dev.small_compile_s
        total += points * cost.dev.point_s + run
        jobs.append(Job("flash", dtype, total, f"{points} points"))
    return jobs


def _target_job(t: Target, cost: Costs) -> Job:
    """The target's points, three do_bench windows each and one a round (rounds.py)."""
    points = len(t.impls) * len(t.head_dims) * len(t.seq_lens)
    flops = sum(
        3.5 * 4.0 * t.batch_size * t.heads * n * n * d / 2 for d in t.head_dims for n in t.seq_lens
    )
    pre = CACHED_PRECOMPILE_S if "kernel_tests" in cost.stages else cost.dev.triton_precompile_s
    total = cost.dev.job_start_s + cost.dev.flash_setup_s + pre + points * cost.dev.point_s
    total += 8 * len(t.impls) * flops / cost.rate(t.dtype)
    windows = points * (3 + t.rounds)
    total += windows * ((t.warmup_ms or 0) + (t.rep_ms or 0)) / 1e3
    return Job("flash", "target", total, f"{points} points")


def _leaderboard_job(b: Leaderboard, cost: Costs) -> Job:
    """fwd, bwd and fwd+bwd windows and the correctness check per implementation."""
    windows = (b.warmup_ms if b.warmup_ms is not None else 500) + (
        b.rep_ms if b.rep_ms is not None else 2000
    )
    per = 3 * windows / 1e3 + LEADERBOARD_CHECK_S
    pre = CACHED_PRECOMPILE_S if "kernel_tests" in cost.stages else cost.dev.triton_precompile_s
    total = cost.dev.job_start_s + cost.dev.flash_setup_s + pre + len(b.impls) * per
    return Job("flash", "leaderboard", total, f"{len(b.impls)} implementations")


def estimate(k: FlashKnobs, cost: Costs) -> list[Job]:
    """One sweep job per dtype, the target's job and the leaderboard's, where configured."""
    jobs = _sweep_jobs(k, cost)
    if k.target:
        jobs.append(_target_job(k.target, cost))
    if k.leaderboard:
        jobs.append(_leaderboard_job(k.leaderboard, cost))
    return jobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    for i, d in enumerate(cfg["head_dims"]):
        if why := head_dim_problem(d, MAX_HEAD_DIM):
            at.fail(("head_dims", i), d, why)
    for i, d in enumerate((cfg.get("target") or {}).get("head_dims", [])):
        if why := head_dim_problem(d, MAX_HEAD_DIM):
            at.fail(("target", "head_dims", i), d, why)
    board = cfg.get("leaderboard")
    if board and (why := head_dim_problem(board["head_dim"], MAX_HEAD_DIM)):
        at.fail(("leaderboard", "head_dim"), board["head_dim"], why)
