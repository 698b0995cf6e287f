"""Stage `attention`: naive PyTorch attention, eager and torch.compile'd, over head dim x length.

    python -m cs336_systems.stages.attention --impl naive_eager --machine M --preset P \
        --block '{"impls": ["naive_eager"], "batch_size": 8, "head_dims": [16, 32, 64, 128],
        "seq_lens": [256, 1024, 4096], "causal": false, "warmup_steps": 5, "fwd_steps": 100,
        "bwd_steps": 100}' --out X.csv

One head, random fp32 Q, K, V of shape (batch, n, d). Per point: warm-up forward+backward
passes, then `fwd_steps` timed forward passes, the memory in use once a forward pass has built
its graph (what backward will need), then `bwd_steps` timed backward passes (each after an
untimed forward). A point that runs out of memory is a row with status `oom` and the phase
where it happened; the forward timings survive a backward OOM.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.core.device import allow_recompiles
from cs336_systems.core.harness import (
    Stopwatch,
    is_oom,
    release_memory,
    short_reason,
    summarize,
    synchronize,
    time_steps,
)
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.model import naive_attention
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.stages.attention.plan import AttentionKnobs

log = get_logger(__name__)

IMPLS = ("naive_eager", "naive_compiled")
FP32_BYTES = 4


def attention_fn(impl: str):
    if impl == "naive_eager":
        return naive_attention
    if impl == "naive_compiled":
        allow_recompiles()
        # dynamic: one graph for every length of a head dim, instead of one compile per n
        return torch.compile(naive_attention, dynamic=True)
    raise ValueError(f"unknown implementation {impl!r}; known: {IMPLS}")


def memory_accounting(batch: int, n: int, d: int, bytes_per: int = FP32_BYTES) -> dict:
    """What naive attention holds, in MiB, by counting tensors.

    Forward: S = Q K^T / sqrt(d) and P = softmax(S) are both (batch x n x n) and alive together
    (peak 2 n^2). Autograd saves Q and K (for S), P (softmax's output, for its own backward and
    for P V) and V; with the inputs, dO and the output O this is what is in use before backward:
    5 (n x d) + 1 (n x n). Backward adds dP = dO V^T and dS = P * (dP - rowsum(dP * P)), two more
    (n x n) buffers alive at once: peak about 3 (n x n) + 5 (n x d) (+ the (n x d) gradients).
    """
    mib = 2**20
    nn = batch * n * n * bytes_per
    nd = batch * n * d * bytes_per
    return {
        "inputs_mb": 3 * nd / mib,
        "scores_mb": nn / mib,
        "probs_mb": nn / mib,
        "saved_for_backward_mb": (3 * nd + nn) / mib,
        "expected_before_backward_mb": (5 * nd + nn) / mib,
        "expected_forward_peak_mb": (5 * nd + 2 * nn) / mib,
        "expected_backward_peak_mb": (8 * nd + 3 * nn) / mib,
    }


def _device_memory_mb(device: torch.device, peak: bool = False) -> float:
    if device.type != "cuda":
        return float("nan")
    fn = torch.cuda.max_memory_allocated if peak else torch.cuda.memory_allocated
    return fn(device) / 2**20


def measure_point(
    fn,
    batch: int,
    n: int,
    d: int,
    causal: bool,
    warmup: int,
    fwd_steps: int,
    bwd_steps: int,
    device: torch.device,
) -> dict:
    """Time one (d, n) point; raises nothing: OOM and errors become the row's status."""
    row: dict = {"status": "ok", "oom_phase": ""}
    phase = "setup"
    try:
        g = torch.Generator(device="cpu").manual_seed(n * 1000 + d)
        q, k, v = (
            torch.randn(batch, n, d, generator=g).to(device).requires_grad_() for _ in range(3)
        )
        grad_out = torch.randn(batch, n, d, generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        phase = "warmup"
        first = Stopwatch()
        for i in range(max(warmup, 1)):
            fn(q, k, v, is_causal=causal).backward(grad_out)
            if i == 0:
                synchronize(device)
                row["first_call_s"] = first.stop()
        q.grad = k.grad = v.grad = None

        phase = "forward"
        _, fwd = time_steps(lambda: fn(q, k, v, is_causal=causal), 0, fwd_steps, device)
        row.update(summarize(fwd, "fwd"))

        phase = "memory"
        out = fn(q, k, v, is_causal=causal)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        row["mem_before_backward_mb"] = _device_memory_mb(device)
        out.backward(grad_out)
        del out

        phase = "backward"
        state: dict = {}

        def forward_untimed(_phase: str, _i: int) -> None:
            q.grad = k.grad = v.grad = None
            state["out"] = fn(q, k, v, is_causal=causal)

        _, bwd = time_steps(
            lambda: state.pop("out").backward(grad_out), 0, bwd_steps, device, forward_untimed
        )
        row.update(summarize(bwd, "bwd"))
        row["peak_memory_mb"] = _device_memory_mb(device, peak=True)
    except Exception as exc:  # a failed point is a row, not a crash
        row["status"] = "oom" if is_oom(exc) else f"error: {short_reason(exc)}"
        row["oom_phase" if is_oom(exc) else "failed_phase"] = phase
        row["peak_memory_mb"] = _device_memory_mb(device, peak=True)
        log.warning("failed in %s: %s", phase, row["status"])
        log.debug("traceback", exc_info=True)
    finally:
        release_memory()
    return row


def run(
    impl: str,
    batch: int,
    head_dims: list[int],
    seq_lens: list[int],
    causal: bool,
    warmup: int,
    fwd_steps: int,
    bwd_steps: int,
    device: torch.device,
    base: dict,
) -> list[dict]:
    fn = attention_fn(impl)
    rows = []
    for d in head_dims:
        for n in seq_lens:
            with point(impl, f"d={d}", f"n={n}"):
                res = measure_point(fn, batch, n, d, causal, warmup, fwd_steps, bwd_steps, device)
                row = {
                    **base,
                    "impl": impl,
                    "compile": "compiled" if impl.endswith("compiled") else "eager",
                    "dtype": "fp32",
                    "batch_size": batch,
                    "heads": 1,
                    "d_head": d,
                    "seq_len": n,
                    "causal": causal,
                    "warmup_steps": warmup,
                    "fwd_steps": fwd_steps,
                    "bwd_steps": bwd_steps,
                    **memory_accounting(batch, n, d),
                    **res,
                }
                rows.append(row)
                log.log(
                    status_level(row["status"]),
                    "%s fwd %.3f ms, bwd %.3f ms",
                    row["status"],
                    row.get("fwd_ms_mean", float("nan")),
                    row.get("bwd_ms_mean", float("nan")),
                )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's implementation, its device, where its rows go and what
    they say they come from) and the stage's knobs as one value (`--block`: its preset block,
    `AttentionKnobs`)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--impl", required=True, choices=IMPLS)
    ap.add_argument("--device", help="the device (cuda where there is one, else cpu)")
    add_run_arguments(ap)
    add_block_argument(ap, AttentionKnobs)
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    k: AttentionKnobs = args.block
    configure("attention")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = {**provenance(args.machine, args.preset, args.edition), "device": device.type}
    if device.type == "cuda":
        base["device_memory_mb"] = torch.cuda.get_device_properties(device).total_memory / 2**20
    rows = run(
        args.impl,
        k.batch_size,
        list(k.head_dims),
        list(k.seq_lens),
        k.causal,
        k.warmup_steps,
        k.fwd_steps,
        k.bwd_steps,
        device,
        base,
    )
    write_csv(rows, args.out)
    log.info("wrote %s: %d rows", args.out, len(rows))


if __name__ == "__main__":
    main()
