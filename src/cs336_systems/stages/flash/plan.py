"""The flash stage's knobs (`FlashKnobs`, one per preset block of config/stages/flash.yaml) and
what the workflow needs to plan the stage's jobs from a block."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts, head_dim_problem
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
    """Our kernel's fixed-cost target (issue 21): ours against SDPA cuDNN at short lengths, with
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


def point_files(cfg: dict, results: str) -> list[str]:
    files = [f"{results}/flash/points/{dtype}.csv" for dtype in cfg["dtypes"]]
    files += [f"{results}/flash/target.csv"] if cfg.get("target") else []
    return files + ([f"{results}/flash/leaderboard.csv"] if cfg.get("leaderboard") else [])


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
