"""Stage `flash`: causal attention implementations side by side over length x head dim x dtype.

    python -m cs336_systems.stages.flash sweep --dtype bf16 --machine M --preset P --block JSON \
        --kernel-tests results/M/kernel_tests.csv --out X.csv
    python -m cs336_systems.stages.flash target|leaderboard --machine M --preset P --block JSON ...

`--block`: the job's part of the stage's preset block as JSON (plan.py: `SWEEP_KNOBS`,
`TARGET_KNOBS`, `LEADERBOARD_KNOBS`, as the rules pass them); jobs.py reads what the job runs
from it (`job_of`, `timer_of`), which points it skips and which rows a resumed job keeps.

Implementations: naive PyTorch attention eager and torch.compile'd, our FlashAttention-2 in
PyTorch and in Triton, and PyTorch SDPA pinned to one backend at a time (flash, cuDNN,
memory-efficient) with torch.nn.attention.sdpa_kernel. Every point first checks the forward
output against an fp32 reference (computed in query chunks, so it fits for any length) and that
backward gives finite gradients, then times forward, backward (on a retained graph) and
forward+backward with harness.device_time: triton.testing.do_bench (median and 20/80%
quantiles, L2 flushed between runs) on the GPU; the harness's synchronized timer on CPU, where
do_bench cannot run.
TFLOP/s use cs336_systems.core.costs.attention_flops (causal: half the square). Our kernels are
benchmarked only when the kernel tests passed. The target job then times each point's
forward+backward again in paired rounds (rounds.py), its implementations back to back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from pathlib import Path

import torch

from cs336_systems.core import costs as flops
from cs336_systems.core.harness import is_oom, release_memory, short_reason
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.stages.flash.jobs import (
    CAP_SKIP,
    Job,
    Timer,
    cap_cost,
    finished_rows,
    gate_passed,
    gate_verdict,
    job_of,
    kernel_verdicts,
    resume_key,
    skip_reason,
    timer_of,
)
from cs336_systems.stages.flash.plan import LEADERBOARD_KNOBS, SWEEP_KNOBS, TARGET_KNOBS
from cs336_systems.stages.flash.rounds import add_rounds, needs_rounds, point_inputs

log = get_logger(__name__)

IMPLS = (
    "naive_eager",
    "naive_compiled",
    "flash_pytorch",
    "flash_triton",
    "sdpa_flash",
    "sdpa_cudnn",
    "sdpa_efficient",
)
PASSES = ("forward", "backward", "forward_backward")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# max |out - ref| allowed: atol + rtol * max |ref|
CHECK_TOL = {torch.float32: (2e-3, 2e-3), torch.float16: (5e-3, 1e-2), torch.bfloat16: (2e-2, 3e-2)}


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "sdpa_flash": SDPBackend.FLASH_ATTENTION,
        "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend_name]

    def fn(q, k, v):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    return fn


def make_impl(name: str, flash_tiles: tuple[int, int] = (64, 64)):
    """A callable (q, k, v) -> out on (batch, heads, n, d) tensors, causal."""
    if name == "naive_eager":
        from cs336_systems.model import naive_attention

        return lambda q, k, v: naive_attention(q, k, v, is_causal=True)
    if name == "naive_compiled":
        from cs336_systems.core.device import allow_recompiles
        from cs336_systems.model import naive_attention

        allow_recompiles()
        compiled = torch.compile(naive_attention, dynamic=True)
        return lambda q, k, v: compiled(q, k, v, is_causal=True)
    if name == "flash_pytorch":
        from cs336_systems.kernels.flash_pytorch import FlashAttentionPytorch

        FlashAttentionPytorch.tile_q, FlashAttentionPytorch.tile_k = flash_tiles
        return lambda q, k, v: FlashAttentionPytorch.apply(q, k, v, True)
    if name == "flash_triton":
        from cs336_systems.kernels.flash_triton import FlashAttentionTriton

        return lambda q, k, v: FlashAttentionTriton.apply(q, k, v, True)
    if name.startswith("sdpa_"):
        return _sdpa(name)
    raise ValueError(f"unknown implementation {name!r}; known: {IMPLS}")


@contextlib.contextmanager
def full_fp32_matmuls():
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def reference_output(q, k, v, chunk: int = 2048) -> torch.Tensor:
    """fp32 causal attention (top-left: key index <= query index), a chunk of queries at a time
    so that the (chunk x n) score block, not the (n x n) matrix, is what has to fit."""
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    kf, vf = k.float(), v.float()
    keys = torch.arange(n_k, device=q.device)
    with torch.no_grad(), full_fp32_matmuls():
        for i0 in range(0, n_q, chunk):
            i1 = min(i0 + chunk, n_q)
            s = q[..., i0:i1, :].float() @ kf.transpose(-1, -2) / math.sqrt(d)
            rows = torch.arange(i0, i1, device=q.device)[:, None]
            s.masked_fill_(keys[None, :] > rows, -math.inf)
            out[..., i0:i1, :] = torch.softmax(s, dim=-1) @ vf
            del s
    return out


def leaderboard_time(impl: str, fn, q, k, v, timer: Timer) -> dict:
    """The course leaderboard's own measurement: the attention call through torch.compile
    (our autograd Function's ``apply`` on (batch x heads, n, d) tensors, as the leaderboard
    script calls it; SDPA on the 4-D tensors it needs), then forward and backward of
    ``o.sum()``, timed with do_bench. CUDA only (torch.compile on CPU would build C++)."""
    if q.device.type != "cuda":
        return {"lb_status": "cuda only"}
    step, leaves = leaderboard_step(impl, fn, q, k, v)
    step()
    return {"lb_status": "ok", **timer(step, "lb", leaves)}


def leaderboard_step(impl: str, fn, q, k, v):
    """The leaderboard's step (compiled call, then backward of ``o.sum()``) for `impl` (`fn`
    for the SDPA backends) and the leaves whose gradients it fills."""
    if impl == "flash_triton":
        from cs336_systems.kernels.flash_triton import FlashAttentionTriton

        b, h, n, d = q.shape
        leaves = [x.detach().reshape(b * h, n, d).requires_grad_() for x in (q, k, v)]
        compiled = torch.compile(FlashAttentionTriton.apply)

        def call():
            return compiled(*leaves, True)
    else:
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        compiled = torch.compile(fn)

        def call():
            return compiled(*leaves)

    def step():
        call().sum().backward()

    return step, leaves


def _config_text(cfg: dict | None) -> str:
    if not cfg:
        return ""
    text = f"{cfg['BLOCK_Q']}x{cfg['BLOCK_K']}"
    if cfg.get("num_warps"):
        text += f" w{cfg['num_warps']} s{cfg['num_stages']}"
    if cfg.get("kernel") == "gluon":
        text += " gluon ws" if cfg.get("warp_specialized") else " gluon"
    return text


def check_output(fn, q, k, v, do, ref_cache: dict, row: dict) -> None:
    """The forward's output against the fp32 reference (its max abs error into `row`), then
    that backward gives finite gradients; raises AssertionError where either fails."""
    key = (*q.shape, q.dtype)
    if key not in ref_cache:
        ref_cache.clear()
        ref_cache[key] = reference_output(q.detach(), k.detach(), v.detach())
    ref = ref_cache[key]
    out = fn(q, k, v)
    err = (out.detach().float() - ref).abs().max().item()
    atol, rtol = CHECK_TOL[q.dtype]
    allowed = atol + rtol * ref.abs().max().item()
    row["max_abs_err"] = err
    if not math.isfinite(err) or err > allowed:
        raise AssertionError(
            f"output differs from the reference: max abs err {err:.3g} > {allowed:.3g}"
        )
    out.backward(do)
    for name, x in zip("qkv", (q, k, v), strict=True):
        if x.grad is None or not torch.isfinite(x.grad).all():
            raise AssertionError(f"backward gave no or non-finite d{name}")


def triton_configs() -> dict:
    """The configs our Triton kernel's last call ran, as the row's columns."""
    from cs336_systems.kernels.flash_triton import chosen_configs

    chosen = chosen_configs()
    return {
        "triton_fwd_config": _config_text(chosen.get("forward")),
        "triton_dkdv_config": _config_text(chosen.get("backward_dkdv")),
        "triton_dq_config": _config_text(chosen.get("backward_dq")),
        "triton_fused_config": _config_text(chosen.get("backward_fused")),
        "triton_tma": bool(chosen.get("forward", {}).get("use_desc")),
    }


def time_backward(fn, q, k, v, do, timer: Timer, grads: list) -> dict:
    """Backward alone, on a retained graph; where that fails (not for lack of memory), it is
    left to be forward+backward less forward (`bwd_method` says which)."""
    row: dict = {}
    try:
        out = fn(q, k, v)
        row.update(timer(lambda: out.backward(do, retain_graph=True), "bwd", grads))
        row["bwd_method"] = "retained graph"
    except RuntimeError as exc:
        if is_oom(exc):
            raise
        row["bwd_method"] = f"forward_backward - forward ({short_reason(exc, 60)})"
    return row


def add_flops(row: dict, batch: int, heads: int, n: int, d: int) -> None:
    """Each timed pass's FLOPs (core.costs.attention_flops, causal) and TFLOP/s."""
    for pass_, prefix in (
        *zip(PASSES, ("fwd", "bwd", "fwd_bwd"), strict=True),
        ("forward_backward", "lb"),
    ):
        if prefix == "lb" and "lb_ms_median" not in row:
            continue
        ms = row.get(f"{prefix}_ms_median", float("nan"))
        f = flops.attention_flops(batch, heads, n, n, d, True, pass_)
        row[f"{prefix}_flops"] = f
        row[f"{prefix}_tflops"] = flops.tflops(f, ms) if ms == ms else float("nan")


def measure(
    impl: str,
    fn,
    batch: int,
    heads: int,
    n: int,
    d: int,
    dtype: torch.dtype,
    device: torch.device,
    timer: Timer,
    ref_cache: dict,
    leaderboard: bool = False,
) -> dict:
    """Check, then time the three passes of one point (and, for the leaderboard point, the
    leaderboard's own compiled measurement). Never raises: failures are the status."""
    row: dict = {"status": "ok"}
    stage = "inputs"
    try:
        q, k, v, do = point_inputs((batch, heads, n, d), dtype, device)
        stage = "check"
        check_output(fn, q, k, v, do, ref_cache, row)
        if impl == "flash_triton":
            row.update(triton_configs())
        grads = [q, k, v]
        stage = "forward"
        row.update(timer(lambda: fn(q, k, v), "fwd", grads))
        stage = "backward"
        row.update(time_backward(fn, q, k, v, do, timer, grads))
        stage = "forward_backward"
        row.update(timer(lambda: fn(q, k, v).backward(do), "fwd_bwd", grads))
        if "bwd_ms_median" not in row:
            row["bwd_ms_median"] = row["fwd_bwd_ms_median"] - row["fwd_ms_median"]
        if leaderboard:
            stage = "leaderboard"
            row.update(leaderboard_time(impl, fn, q, k, v, timer))
    except Exception as exc:  # a failed point is a row, not a crash
        row["status"] = "oom" if is_oom(exc) else f"error: {short_reason(exc)}"
        row["failed_stage"] = stage
        log.debug("failed in %s", stage, exc_info=True)
    finally:
        q = k = v = do = None  # noqa: F841
        release_memory()
    add_flops(row, batch, heads, n, d)
    return row


def precompile(job: Job, device: torch.device, verdicts: dict[str, str] | None) -> dict:
    """Our Triton kernels for the job's dtype and head dims compiled before the first point
    (CUDA, where they are measured); the columns its rows get."""
    if not (
        "flash_triton" in job.impls
        and device.type == "cuda"
        and gate_passed("flash_triton", verdicts)
    ):
        return {}
    from cs336_systems.kernels.triton.launch import precompile

    done = precompile(dtypes=(DTYPES[job.dtype],), head_dims=tuple(job.head_dims), causal=(True,))
    log.info("precompiled %d Triton kernels in %.1f s", done["jobs"], done["seconds"])
    for err in done["errors"]:
        log.warning("precompile: %s", err)
    return {"triton_precompile_s": done["seconds"]}


def point_row(job: Job, impl: str, n: int, d: int, timer: Timer, verdict: str, base: dict) -> dict:
    """What a point's row says before it is measured: the point, how it is timed and what
    gated it (its `resume_key`)."""
    row = {
        **base,
        "grid": job.grid,
        "impl": impl,
        "dtype": job.dtype,
        "batch_size": job.batch_size,
        "heads": job.heads,
        "seq_len": n,
        "d_head": d,
        "causal": True,
        "timer": timer.name,
        "timing": timer.settings,
        "fp32_matmul_precision": torch.get_float32_matmul_precision(),
        "kernel_tests": verdict,
    }
    if impl == "flash_pytorch":
        row["flash_tiles"] = f"{job.flash_tiles[0]}x{job.flash_tiles[1]}"
    return row


class Points:
    """A job's points measured one after another: each implementation built once, the
    reference output of the last shape kept, the rows so far rewritten to `partial` after each
    point, and a point whose ok row is already there (an interrupted job's) taken from it."""

    def __init__(self, job: Job, device: torch.device, timer: Timer, partial=None):
        self.job, self.device, self.timer, self.partial = job, device, timer, partial
        self.done = finished_rows(partial)
        if self.done:
            log.info("resuming: %d finished rows in %s", len(self.done), partial)
        self.fns: dict = {}
        self.ref_cache: dict = {}
        self.rows: list[dict] = []

    def fn(self, impl: str):
        if impl not in self.fns:
            self.fns[impl] = make_impl(impl, self.job.flash_tiles)
        return self.fns[impl]

    def add(self, row: dict, reason: str) -> None:
        """The point of `row` (skipped with `reason`, kept from the partial CSV, or measured)."""
        job, impl, n, d = self.job, row["impl"], row["seq_len"], row["d_head"]
        with point(job.grid, impl, job.dtype, f"d={d}", f"n={n}"):
            if resume_key(row) in self.done:
                self.rows.append(self.done[resume_key(row)])
                log.info("ok (kept from %s)", self.partial)
                return
            if reason.startswith(CAP_SKIP) and (cost := cap_cost(self.rows, row)):
                reason += f" ({cost})"
            if reason:
                row["status"] = reason
            else:
                row.update(
                    measure(
                        impl,
                        self.fn(impl),
                        job.batch_size,
                        job.heads,
                        n,
                        d,
                        DTYPES[job.dtype],
                        self.device,
                        self.timer,
                        self.ref_cache,
                        leaderboard=job.grid == "leaderboard",
                    )
                )
            self.rows.append(row)
            self.save()
            shown = row.get("fwd_bwd_ms_median", float("nan"))
            log.log(
                status_level(row["status"]),
                "%s%s",
                row["status"],
                f" fwd+bwd {shown:.3f} ms" if shown == shown else "",
            )

    def add_rounds(self, d: int, n: int) -> None:
        """The last point's paired rounds (rounds.py), where its implementations all passed."""
        job = self.job
        here = self.rows[-len(job.impls) :]
        if not (job.rounds and needs_rounds(here)):
            return
        with point(job.grid, "rounds", job.dtype, f"d={d}", f"n={n}"):
            for impl in job.impls:
                self.fn(impl)
            shape = (job.batch_size, job.heads, n, d)
            dtype = DTYPES[job.dtype]
            add_rounds(here, self.fns, shape, dtype, self.device, self.timer, job.rounds)
            self.save()

    def save(self) -> None:
        if self.partial:
            write_csv(self.rows, self.partial)


def run(
    job: Job,
    device: torch.device,
    timer: Timer,
    verdicts: dict[str, str] | None,
    base: dict,
    partial: str | os.PathLike | None = None,
) -> list[dict]:
    """Every point's row. With `partial`, the rows so far are rewritten there (atomically) after
    each point, and a point whose row is already there with status ok (an interrupted job's) is
    taken from it instead of measured again. With the job's `rounds`, each point whose
    implementations all passed then gets its paired rounds (rounds.py)."""
    points = Points(job, device, timer, partial)
    extra = precompile(job, device, verdicts)
    for d in job.head_dims:
        for n in job.seq_lens:
            for impl in job.impls:
                row = point_row(job, impl, n, d, timer, gate_verdict(impl, verdicts), base)
                if impl == "flash_triton":
                    row.update(extra)
                why = skip_reason(impl, n, job.dtype, device, job.max_seq_len, verdicts)
                points.add(row, why)
            points.add_rounds(d, n)
    return points.rows


JOBS = {"sweep": SWEEP_KNOBS, "target": TARGET_KNOBS, "leaderboard": LEADERBOARD_KNOBS}
# the columns every row has (empty where our Triton kernel did not run)
CONFIG_COLUMNS = (
    "triton_fwd_config",
    "triton_dkdv_config",
    "triton_dq_config",
    "triton_fused_config",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the sweep's dtype, the kernel tests' verdicts, where its rows go
    and what they say they come from) and the job's part of the stage's knobs (`--block`)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, knobs in JOBS.items():
        p = sub.add_parser(name)
        add_run_arguments(p)
        add_block_argument(p, knobs)
        p.add_argument("--kernel-tests", default="", help="the kernel tests' CSV (the gate)")
        p.add_argument(
            "--partial",
            default="",
            help="rows so far, rewritten after each point; a rerun keeps its ok rows (resume)",
        )
    sub.choices["sweep"].add_argument("--dtype", required=True, choices=sorted(DTYPES))
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("flash")
    k = args.block

    # not a knob: the device (CUDA when present)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        # before the Triton kernels are imported: they run in Triton's interpreter on CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_float32_matmul_precision(k.fp32_matmul_precision)
    timer = timer_of(args, device)
    base = {**provenance(args.machine, args.preset, args.edition), "device": device.type}
    verdicts = kernel_verdicts(args.kernel_tests)
    rows = run(job_of(args), device, timer, verdicts, base, args.partial or None)
    for row in rows:
        for key in CONFIG_COLUMNS:
            row.setdefault(key, "")
    write_csv(rows, args.out)
    if args.partial:  # complete: a later run (code or config changed) measures afresh
        Path(args.partial).unlink(missing_ok=True)
    log.info("wrote %s: %d rows; %s", args.out, len(rows), json.dumps(_status_counts(rows)))


def _status_counts(rows: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        key = r["status"].split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


if __name__ == "__main__":
    main()
