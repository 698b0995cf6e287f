"""Stage `flash`, what one job runs: its points, read from its part of the block (`Job`), its
timer (`Timer`: the stage's settings of harness.device_time), the points it skips (an SDPA
backend without a kernel for the dtype, the kernel tests' gate, the caps of `max_seq_len`, bf16 in Triton's interpreter) and the rows of an
interrupted job that a rerun keeps (`finished_rows`, by `resume_key`). measure.py measures."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from cs336_systems.core.harness import device_time, timer_name
from cs336_systems.core.results import verdicts
from cs336_systems.stages.flash.plan import SWEEP_HEADS, TUNE_STEPS, no_kernel, seq_cap

# the start of a point's status where `max_seq_len` caps it (the cap and what it names follow)
CAP_SKIP = "skipped: n above this preset's max_seq_len"
# implementation -> the kernel (as the kernel_tests stage names it) whose tests gate it
GATED_BY = {"flash_pytorch": "flash_pytorch", "flash_triton": "flash_triton"}


@dataclass(frozen=True)
class Job:
    """What one job runs, read from its part of the block (plan.py: `SWEEP_KNOBS`,
    `TARGET_KNOBS`, `LEADERBOARD_KNOBS`): its grid (the rows' `grid`), the implementations, the
    dtype, batch, heads, head dims and lengths, the caps and PyTorch FA2 tiles every job shares,
    and the target's paired rounds (rounds.py; 0: none)."""

    grid: str
    impls: list[str]
    dtype: str
    batch_size: int
    heads: int
    head_dims: list[int]
    seq_lens: list[int]
    max_seq_len: dict
    flash_tiles: tuple[int, int]
    rounds: int = 0


def job_of(args: argparse.Namespace) -> Job:
    """The job `args.cmd` runs: the sweep's axes (at `--dtype`, the handout's one head), or the
    target's or the leaderboard's own points."""
    k = args.block
    sweep = args.cmd == "sweep"
    own = k if sweep else getattr(k, args.cmd)
    if args.cmd == "leaderboard":
        dims, lens = [own.head_dim], [own.seq_len]
    else:
        dims, lens = list(own.head_dims), list(own.seq_lens)
    return Job(
        grid=args.cmd,
        impls=list(own.impls),
        dtype=args.dtype if sweep else own.dtype,
        batch_size=own.batch_size,
        heads=SWEEP_HEADS if sweep else own.heads,
        head_dims=dims,
        seq_lens=lens,
        max_seq_len=dict(k.max_seq_len),
        flash_tiles=tuple(k.flash_pytorch_tiles),
        rounds=own.rounds if args.cmd == "target" else 0,
    )


class Timer:
    """The stage's settings of harness.device_time: do_bench (median, 20/80% quantiles) on
    CUDA; harness.time_steps (mean/std/median) on CPU."""

    QUANTILES = (0.5, 0.2, 0.8)

    def __init__(self, device, warmup_ms: float, rep_ms: float, warmup_steps: int, steps: int):
        self.device = device
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.warmup_steps, self.steps = warmup_steps, steps

    @property
    def name(self) -> str:
        return timer_name(self.device)

    @property
    def settings(self) -> str:
        return (
            f"warmup_ms={self.warmup_ms:g} rep_ms={self.rep_ms:g}"
            f" warmup_steps={self.warmup_steps} steps={self.steps}"
        )

    def __call__(self, fn, prefix: str, grads: list[torch.Tensor]) -> dict:
        return device_time(
            fn,
            self.device,
            prefix,
            warmup_ms=self.warmup_ms,
            rep_ms=self.rep_ms,
            quantiles=self.QUANTILES,
            grad_to_none=grads,
            warmup_steps=self.warmup_steps,
            steps=self.steps,
        )


def timer_of(args: argparse.Namespace, device: torch.device) -> Timer:
    """The job's timer: the block's `timing`, with the target's or the leaderboard's own
    do_bench windows where given."""
    t = args.block.timing
    own = None if args.cmd == "sweep" else getattr(args.block, args.cmd)
    warmup_ms = own.warmup_ms if own is not None and own.warmup_ms is not None else t.warmup_ms
    rep_ms = own.rep_ms if own is not None and own.rep_ms is not None else t.rep_ms
    return Timer(device, float(warmup_ms), float(rep_ms), t.warmup_steps, t.steps)


def kernel_verdicts(path: str | None) -> dict[str, str] | None:
    """{kernel: verdict} of the kernel_tests CSV; None without the stage (nothing gates)."""
    return verdicts(path) if path else None


def gate_verdict(impl: str, verdicts: dict[str, str] | None) -> str:
    """The kernel tests' verdict on `impl`'s kernel ('' ungated; `not selected`: no test of it
    ran). Only '' and `passed` are timed: an unverified kernel is a `skipped` row."""
    kernel = GATED_BY.get(impl)
    if not kernel or verdicts is None:
        return ""
    return verdicts.get(kernel, "not selected")


def gate_passed(impl: str, verdicts: dict[str, str] | None) -> bool:
    return gate_verdict(impl, verdicts) in ("", "passed")


def skip_reason(
    impl: str,
    n: int,
    dtype_name: str,
    device: torch.device,
    max_seq_len: dict,
    verdicts: dict[str, str] | None,
) -> str:
    """Why the point is not run ('' where it is): a backend without a kernel for the dtype,
    the kernel tests' gate, the cap of `max_seq_len`, bf16 in Triton's interpreter."""
    if device.type == "cuda" and (why := no_kernel(impl, dtype_name)):
        return why
    verdict = gate_verdict(impl, verdicts)
    if verdict == "failed":
        return "skipped: kernel tests failed"
    if not gate_passed(impl, verdicts):
        why = {"not selected": "no test of it selected", "not run": "every selected test skipped"}
        return f"skipped: kernel tests did not check {GATED_BY[impl]} ({why.get(verdict)})"
    if n > (cap := seq_cap(max_seq_len, impl, dtype_name)):
        per = f"{impl} in {dtype_name}" if isinstance(max_seq_len.get(impl), dict) else impl
        return f"{CAP_SKIP} {cap} for {per}"
    if impl == "flash_triton" and device.type == "cpu" and dtype_name == "bf16":
        return "skipped: Triton's interpreter computes bf16 wrongly"
    return ""


# the timed calls of a point besides autotuning: the check, three do_bench windows' estimates
TIMED_CALLS = 8
# what a capped implementation holds of size n x n (its backward's scores; naive: the scores,
# the softmax and their gradients): fp32 elements per (batch x head)
SQUARE_COPIES = {"flash_pytorch": 1, "naive_eager": 4, "naive_compiled": 4}
GiB = 2**30


def cap_cost(rows: list[dict], row: dict) -> str:
    """What a point skipped by `max_seq_len` would have cost, computed: the (n x n) memory its
    implementation holds, and its seconds extrapolated as n^2 from the longest point of the same
    implementation, dtype and head dim that ran in this job (`rows`), times its timed calls
    (and, on a GPU, our Triton kernel's autotuning at a new length: plan.py TUNE_STEPS)."""
    impl, n = row["impl"], int(row["seq_len"])
    parts = []
    if impl in SQUARE_COPIES:
        gib = SQUARE_COPIES[impl] * 4 * row["batch_size"] * row["heads"] * n * n / GiB
        parts.append(f"its (n x n) scores hold {gib:.1f} GiB")
    done = [
        r
        for r in rows
        if r.get("status") == "ok"
        and (r["impl"], r["dtype"], r["d_head"]) == (impl, row["dtype"], row["d_head"])
        and int(r["seq_len"]) < n
        and r.get("fwd_bwd_ms_median") == r.get("fwd_bwd_ms_median")
    ]
    if done:
        last = max(done, key=lambda r: int(r["seq_len"]))
        n0, ms0 = int(last["seq_len"]), float(last["fwd_bwd_ms_median"])
        step = ms0 * (n / n0) ** 2
        tuned = impl == "flash_triton" and row.get("device") == "cuda"  # no autotuner on CPU
        calls = TIMED_CALLS + (TUNE_STEPS if tuned else 0)
        parts.append(
            f"about {step * calls / 1e3:.0f} s: a {step:.0f} ms forward+backward (n^2 from "
            f"{ms0:.3g} ms at n = {n0}) x {calls} calls" + (" with autotuning" if tuned else "")
        )
    return "; ".join(parts)


# what makes a finished row reusable by a resumed job: the point, how it was timed, what gated
# it, and the code and libraries that measured it
RESUME_KEY = (
    "grid",
    "impl",
    "dtype",
    "batch_size",
    "heads",
    "seq_len",
    "d_head",
    "causal",
    "flash_tiles",
    "timer",
    "timing",
    "fp32_matmul_precision",
    "kernel_tests",
    "git_commit",
    "torch",
    "triton",
)


def _key_text(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def resume_key(row: dict) -> tuple[str, ...]:
    return tuple(_key_text(row.get(k)) for k in RESUME_KEY)


def finished_rows(partial: str | os.PathLike | None) -> dict[tuple[str, ...], dict]:
    """The rows with status ok of an interrupted job's partial CSV, by `resume_key`."""
    if not partial or not Path(partial).exists() or Path(partial).stat().st_size == 0:
        return {}
    df = pd.read_csv(partial)
    rows = [
        {k: v for k, v in r.items() if _key_text(v) != ""}
        for r in df.to_dict("records")
        if r.get("status") == "ok"
    ]
    return {resume_key(r): r for r in rows}
