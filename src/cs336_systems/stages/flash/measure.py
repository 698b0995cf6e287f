"""Stage `flash`: causal attention implementations side by side over length x head dim x dtype.

    python -m cs336_systems.stages.flash sweep --dtype bf16 --machine M --preset P --block JSON \
        --kernel-tests results/M/kernel_tests.csv --out X.csv
    python -m cs336_systems.stages.flash target|leaderboard --machine M --preset P --block JSON ...

`--block`: the job's part of the stage's preset block as JSON (plan.py: `SWEEP_KNOBS`,
`TARGET_KNOBS`, `LEADERBOARD_KNOBS`, as the rules pass them).

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

import pandas as pd
import torch

from cs336_systems.core import costs as flops
from cs336_systems.core.harness import device_time, is_oom, release_memory, short_reason, timer_name
from cs336_systems.core.results import provenance, verdicts, write_csv
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.stages.flash.plan import (
    LEADERBOARD_KNOBS,
    SWEEP_KNOBS,
    TARGET_KNOBS,
    job_settings,
    seq_cap,
)
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
# implementation -> the kernel (as the kernel_tests stage names it) whose tests gate it
GATED_BY = {"flash_pytorch": "flash_pytorch", "flash_triton": "flash_triton"}
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
        key = (batch, heads, n, d, dtype)
        if key not in ref_cache:
            ref_cache.clear()
            ref_cache[key] = reference_output(q.detach(), k.detach(), v.detach())
        ref = ref_cache[key]
        out = fn(q, k, v)
        err = (out.detach().float() - ref).abs().max().item()
        atol, rtol = CHECK_TOL[dtype]
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
        del out
        if impl == "flash_triton":
            from cs336_systems.kernels.flash_triton import chosen_configs

            chosen = chosen_configs()
            row["triton_fwd_config"] = _config_text(chosen.get("forward"))
            row["triton_dkdv_config"] = _config_text(chosen.get("backward_dkdv"))
            row["triton_dq_config"] = _config_text(chosen.get("backward_dq"))
            row["triton_fused_config"] = _config_text(chosen.get("backward_fused"))
            row["triton_tma"] = bool(chosen.get("forward", {}).get("use_desc"))

        grads = [q, k, v]
        stage = "forward"
        row.update(timer(lambda: fn(q, k, v), "fwd", grads))
        stage = "backward"
        try:
            out = fn(q, k, v)
            row.update(timer(lambda: out.backward(do, retain_graph=True), "bwd", grads))
            row["bwd_method"] = "retained graph"
        except RuntimeError as exc:
            if is_oom(exc):
                raise
            row["bwd_method"] = f"forward_backward - forward ({short_reason(exc, 60)})"
        out = None
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
        q = k = v = do = out = None  # noqa: F841
        release_memory()
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
    return row


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
    verdict = gate_verdict(impl, verdicts)
    if verdict == "failed":
        return "skipped: kernel tests failed"
    if not gate_passed(impl, verdicts):
        why = {"not selected": "no test of it selected", "not run": "every selected test skipped"}
        return f"skipped: kernel tests did not check {GATED_BY[impl]} ({why.get(verdict)})"
    if n > (cap := seq_cap(max_seq_len, impl, dtype_name)):
        per = f"{impl} in {dtype_name}" if isinstance(max_seq_len.get(impl), dict) else impl
        return f"skipped: n above this preset's max_seq_len {cap} for {per}"
    if impl == "flash_triton" and device.type == "cpu" and dtype_name == "bf16":
        return "skipped: Triton's interpreter computes bf16 wrongly"
    return ""


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


def run(
    impls: list[str],
    batch: int,
    heads: int,
    seq_lens: list[int],
    head_dims: list[int],
    dtype_name: str,
    device: torch.device,
    timer: Timer,
    max_seq_len: dict,
    verdicts: dict[str, str] | None,
    flash_tiles: tuple[int, int],
    grid: str,
    base: dict,
    partial: str | os.PathLike | None = None,
    rounds: int = 0,
) -> list[dict]:
    """Every point's row. With `partial`, the rows so far are rewritten there (atomically) after
    each point, and a point whose row is already there with status ok (an interrupted job's) is
    taken from it instead of measured again. With `rounds`, each point whose implementations
    all passed then gets its paired rounds (rounds.py)."""
    dtype = DTYPES[dtype_name]
    done = finished_rows(partial)
    if done:
        log.info("resuming: %d finished rows in %s", len(done), partial)
    fns: dict = {}
    extra: dict = {}
    if "flash_triton" in impls and device.type == "cuda" and gate_passed("flash_triton", verdicts):
        from cs336_systems.kernels.triton.launch import precompile

        done = precompile(dtypes=(dtype,), head_dims=tuple(head_dims), causal=(True,))
        extra["triton_precompile_s"] = done["seconds"]
        log.info("precompiled %d Triton kernels in %.1f s", done["jobs"], done["seconds"])
        for err in done["errors"]:
            log.warning("precompile: %s", err)
    rows = []
    ref_cache: dict = {}
    for d in head_dims:
        for n in seq_lens:
            for impl in impls:
                row = {
                    **base,
                    "grid": grid,
                    "impl": impl,
                    "dtype": dtype_name,
                    "batch_size": batch,
                    "heads": heads,
                    "seq_len": n,
                    "d_head": d,
                    "causal": True,
                    "timer": timer.name,
                    "timing": timer.settings,
                    "fp32_matmul_precision": torch.get_float32_matmul_precision(),
                    "kernel_tests": gate_verdict(impl, verdicts),
                }
                if impl == "flash_pytorch":
                    row["flash_tiles"] = f"{flash_tiles[0]}x{flash_tiles[1]}"
                if impl == "flash_triton":
                    row.update(extra)
                reason = skip_reason(impl, n, dtype_name, device, max_seq_len, verdicts)
                with point(grid, impl, dtype_name, f"d={d}", f"n={n}"):
                    if resume_key(row) in done:
                        rows.append(done[resume_key(row)])
                        log.info("ok (kept from %s)", partial)
                        continue
                    if reason:
                        row["status"] = reason
                    else:
                        if impl not in fns:
                            fns[impl] = make_impl(impl, flash_tiles)
                        row.update(
                            measure(
                                impl,
                                fns[impl],
                                batch,
                                heads,
                                n,
                                d,
                                dtype,
                                device,
                                timer,
                                ref_cache,
                                leaderboard=grid == "leaderboard",
                            )
                        )
                    rows.append(row)
                    if partial:
                        write_csv(rows, partial)
                    shown = row.get("fwd_bwd_ms_median", float("nan"))
                    log.log(
                        status_level(row["status"]),
                        "%s%s",
                        row["status"],
                        f" fwd+bwd {shown:.3f} ms" if shown == shown else "",
                    )
            here = rows[-len(impls) :]
            if rounds and needs_rounds(here):
                with point(grid, "rounds", dtype_name, f"d={d}", f"n={n}"):
                    for impl in impls:
                        fns[impl] = fns.get(impl) or make_impl(impl, flash_tiles)
                    add_rounds(here, fns, (batch, heads, n, d), dtype, device, timer, rounds)
                    if partial:
                        write_csv(rows, partial)
    return rows


# not a knob: the device (CUDA when present)
DEVICE = "auto"
JOBS = {"sweep": SWEEP_KNOBS, "target": TARGET_KNOBS, "leaderboard": LEADERBOARD_KNOBS}


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
    return with_knobs(args)


def with_knobs(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with what the job runs (plan.py: `job_settings` of its block) as its attributes."""
    vars(args).update(job_settings(args.cmd, args.block), device=DEVICE)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("flash")

    device_name = args.device
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device_name)
    if device.type == "cpu":
        # before the Triton kernels are imported: they run in Triton's interpreter on CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_float32_matmul_precision(args.fp32_matmul_precision)
    impls = list(args.impls)
    timer = Timer(device, args.warmup_ms, args.rep_ms, args.warmup_steps, args.steps)
    base = {**provenance(args.machine, args.preset, args.edition), "device": device.type}
    dims, lens, grid = args.head_dims, args.seq_lens, args.grid
    rows = run(
        impls,
        args.batch_size,
        args.heads,
        lens,
        dims,
        args.dtype,
        device,
        timer,
        args.max_seq_len,
        kernel_verdicts(args.kernel_tests),
        tuple(args.flash_tiles),
        grid,
        base,
        args.partial or None,
        args.rounds,
    )
    for row in rows:
        for key in (
            "triton_fwd_config",
            "triton_dkdv_config",
            "triton_dq_config",
            "triton_fused_config",
        ):
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
