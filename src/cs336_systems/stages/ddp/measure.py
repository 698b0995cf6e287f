"""Stage `ddp`: data-parallel training steps with each DDP variant, and optimizer-state sharding.

    python -m cs336_systems.stages.ddp.measure variants --backend nccl --world-size 2 --size xl ...
    python -m cs336_systems.stages.ddp.measure sharding --backend nccl --world-size 2 --size xl ...

`variants` (one torchrun launch): first the compute-only baseline (forward, backward, AdamW step
without any communication, on rank 0 while the other ranks wait: a single-process step with
the per-rank batch), then for each DDP variant (naive, flat, overlap, bucketed at each bucket
size, and the peer `torch_ddp`: PyTorch's DistributedDataParallel, 25 MiB buckets) warm-up and
measured steps on the same model. Per step and rank: `fwd_bwd` (forward +
backward, including what overlapped communication slows down), `comm` (from the end of backward
to the end of `finish_gradient_synchronization`: the gradient communication the step waits
for), `opt` (the optimizer step) and `step` (all of it, synchronized at both ends). CUDA events
time the parts on GPU. Each statistic is taken over the slowest rank per step. After timing, the
ranks' parameters are compared: a variant whose replicas diverged is an `error:` row.

`sharding` (one launch): the same training step with AdamW, unsharded and then sharded
(`ShardedOptimizer`), gradients averaged by the overlapped DDP wrapper (it allocates nothing
beyond the gradients). Peak memory (CUDA allocator, max over ranks) after building the model and
optimizer, just before and just after the optimizer step of a measured step, with a breakdown
into parameters, gradients and optimizer state; the time per step.

An optional profile (the `profile` knob) records one step of naive, overlap and the best bucketed
variant with torch.profiler (Chrome traces in `--trace-dir` for the timeline) and, on GPU,
measures how much of the NCCL kernel time ran while compute kernels ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path

from cs336_systems.core.costs import MiB
from cs336_systems.core.harness import StepClock, synchronize, time_marked_steps
from cs336_systems.core.workload import rank_batch
from cs336_systems.parallel.launch import summarize_slowest
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments, block_text
from cs336_systems.planning.log import get_logger, point, status_level
from cs336_systems.profiling.overlap import profile_step
from cs336_systems.stages.ddp.peer import BUCKET_MB as PEER_BUCKET_MB
from cs336_systems.stages.ddp.peer import TorchDDP
from cs336_systems.stages.ddp.plan import DdpKnobs

POINT_KEYS = ("variant", "bucket_size_mb")
# the parts of a step, between the marks `training_step` sets
STEP_PARTS = {
    "fwd_bwd": ("start", "backward"),
    "comm": ("backward", "synced"),
    "opt": ("synced", "end"),
}

log = get_logger(__name__)


# ---- worker --------------------------------------------------------------------------------


def build(args, device):
    import torch

    from cs336_systems.model import build_model

    torch.manual_seed(args.seed)
    with device:  # initialize on the device: an xl model built on the host takes minutes
        return build_model(args.size, args.context_length, edition=args.edition)


def timed_steps(
    step: Callable[[StepClock], None], warmup: int, steps: int, device
) -> dict[str, list[float]]:
    """Per measured step: step (host, synchronized), fwd_bwd, comm, opt (events / host)."""
    return time_marked_steps(step, warmup, steps, device, STEP_PARTS)


def training_step(net, optimizer, x, y, ddp=None) -> Callable[[StepClock], None]:
    import torch.nn.functional as F

    def step(clock: StepClock) -> None:
        clock.mark("start")
        if ddp is not None:
            ddp.on_train_batch_start()
        logits = net(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        clock.mark("backward")
        if ddp is not None:
            ddp.finish_gradient_synchronization()
        clock.mark("synced")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.mark("end")

    return step


def replicas_agree(model, ctx) -> float:
    """Largest relative spread over ranks of the per-parameter sums (0 when replicas agree)."""
    import torch
    import torch.distributed as dist

    sums = torch.stack([p.detach().double().sum() for p in model.parameters()])
    hi, lo = sums.clone(), sums.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return ((hi - lo).abs() / sums.abs().clamp_min(1e-12)).max().item()


def measure_variant(model, variant: str, bucket: float | None, args, ctx, x, y) -> dict:
    """Warm-up and measured steps of one DDP variant on `model`, then the replica check."""
    from cs336_systems.model import make_optimizer, optimizer_impl
    from cs336_systems.parallel.ddp import wrap

    ddp = TorchDDP(model) if variant == "torch_ddp" else wrap(model, variant, bucket)
    try:
        # a fresh optimizer per run: every rank starts it with the same (empty) state
        optimizer = make_optimizer(model, lr=args.lr)
        times = timed_steps(
            training_step(ddp, optimizer, x, y, ddp), args.warmup, args.steps, ctx.device
        )
        spread = replicas_agree(model, ctx)
        row = summarize_slowest(times, ctx)
        row["optimizer"] = optimizer_impl(optimizer)
        row["replica_spread"] = spread
        row["num_buckets"] = getattr(ddp, "num_buckets", None)
        row["num_grad_tensors"] = len(ddp.sync_params)
        row["grad_mb"] = _mb(sum(p.numel() * p.element_size() for p in ddp.sync_params))
        if spread > 1e-6:
            row["status"] = f"error: replicas diverged (relative spread {spread:.1e})"
        return row
    finally:
        ddp.remove_hooks()
        model.zero_grad(set_to_none=True)


def profile_variant(model, variant: str, bucket: float | None, args, ctx, x, y) -> dict:
    from cs336_systems.model import make_optimizer
    from cs336_systems.parallel.ddp import wrap

    ddp = wrap(model, variant, bucket)
    try:
        optimizer = make_optimizer(model, lr=args.lr)
        step = training_step(ddp, optimizer, x, y, ddp)
        step(StepClock(ctx.device))  # one unprofiled step: optimizer state, allocator
        name = f"ddp_{variant}" + (f"_{bucket:g}mb" if bucket is not None else "")
        keep = ctx.is_main and args.trace_dir
        trace = Path(args.trace_dir) / f"{name}_rank0.json" if keep else None
        stats = profile_step(step, ctx.device, trace)
        return {**stats, "trace": trace.name if trace else ""}
    finally:
        ddp.remove_hooks()
        model.zero_grad(set_to_none=True)


def run_variants(args, ctx) -> list[dict]:
    import torch.distributed as dist

    from cs336_systems.core.harness import run_point
    from cs336_systems.model import make_optimizer, optimizer_impl
    from cs336_systems.parallel.launch import write_rows

    device = ctx.device
    model = build(args, device)
    x, y = rank_batch(args.seed, ctx.rank, args.batch_per_rank, args.context_length, device)
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        if ctx.is_main:
            log.log(
                status_level(row["status"]),
                "%s, step %.2f ms, comm %.2f ms",
                row["status"],
                row.get("step_ms_mean", math.nan),
                row.get("comm_ms_mean", math.nan),
            )
        write_rows(rows, args.result, ctx)

    if args.baseline:

        def baseline() -> dict:
            if not ctx.is_main:
                return {}
            optimizer = make_optimizer(model, lr=args.lr)
            step = training_step(model, optimizer, x, y)
            row = summarize_slowest(timed_steps(step, args.warmup, args.steps, device), None)
            row["optimizer"] = optimizer_impl(optimizer)
            model.zero_grad(set_to_none=True)
            return row

        with point("baseline"):
            res = run_point(baseline)
            dist.barrier()
            record(
                {
                    "variant": "baseline",
                    "bucket_size_mb": None,
                    "status": res.status,
                    **(res.value or {}),
                }
            )

    runs = [(v, None) for v in args.variants if v not in ("bucketed", "torch_ddp")]
    if "bucketed" in args.variants:
        runs += [("bucketed", b) for b in args.bucket_sizes_mb]
    if "torch_ddp" in args.variants:  # last: the others reuse the model it wrapped
        runs += [("torch_ddp", PEER_BUCKET_MB)]
    for variant, bucket in runs:
        with point(variant, f"bucket {bucket:g} MB" if bucket is not None else ""):
            res = run_point(
                lambda v=variant, b=bucket: measure_variant(model, v, b, args, ctx, x, y)
            )
            record(
                {
                    "variant": variant,
                    "bucket_size_mb": bucket,
                    "status": res.status,
                    **(res.value or {}),
                }
            )

    if args.profile:
        bucketed = [r for r in rows if r["variant"] == "bucketed" and r["status"] == "ok"]
        best = (
            min(bucketed, key=lambda r: r["step_ms_mean"])["bucket_size_mb"] if bucketed else None
        )
        targets = [("naive", None), ("overlap", None)] + ([("bucketed", best)] if bucketed else [])
        for variant, bucket in targets:
            if variant not in args.variants:
                continue
            with point(variant, f"bucket {bucket:g} MB" if bucket is not None else "", "profile"):
                res = run_point(
                    lambda v=variant, b=bucket: profile_variant(model, v, b, args, ctx, x, y)
                )
            for row in rows:
                if (row["variant"], row["bucket_size_mb"]) == (variant, bucket) and res.value:
                    row.update(res.value)
            write_rows(rows, args.result, ctx)
    return rows


def _mb(nbytes: float) -> float:
    return nbytes / MiB


def _memory_point(args, ctx, sharded: bool) -> dict:
    import torch

    from cs336_systems.model import optimizer_impl
    from cs336_systems.parallel.ddp import DDPOverlapIndividual
    from cs336_systems.parallel.launch import slowest_rank
    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    device = ctx.device
    cuda = device.type == "cuda"

    def allocated() -> tuple[float, float]:
        if not cuda:
            return math.nan, math.nan
        return _mb(torch.cuda.memory_allocated(device)), _mb(
            torch.cuda.max_memory_allocated(device)
        )

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    start_alloc, _ = allocated()
    model = build(args, device)
    ddp = DDPOverlapIndividual(model)
    adamw = {"lr": args.lr, "weight_decay": 0.01, "fused": cuda}
    if sharded:
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), **adamw)
    init_alloc, init_peak = allocated()
    x, y = rank_batch(args.seed, ctx.rank, args.batch_per_rank, args.context_length, device)
    memory: dict[str, float] = {}

    def step(clock: StepClock, record: bool = False) -> None:
        import torch.nn.functional as F

        if record and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        clock.mark("start")
        logits = ddp(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        clock.mark("backward")
        ddp.finish_gradient_synchronization()
        clock.mark("synced")
        if record:
            synchronize(device)
            memory["before_alloc"], memory["before_peak"] = allocated()
            memory["grads_mb"] = _mb(
                sum(
                    p.grad.numel() * p.grad.element_size()
                    for p in model.parameters()
                    if p.grad is not None
                )
            )
        optimizer.step()
        if record:
            synchronize(device)
            memory["after_alloc"], memory["after_peak"] = allocated()
        optimizer.zero_grad(set_to_none=True)
        clock.mark("end")

    times = timed_steps(step, args.warmup, args.steps, device)
    step(StepClock(device), record=True)
    inner = optimizer.local_optimizer if sharded else optimizer
    state_bytes = sum(
        v.numel() * v.element_size()
        for st in inner.state.values()
        for v in st.values()
        if torch.is_tensor(v)
    )
    params_mb = _mb(sum(p.numel() * p.element_size() for p in model.parameters()))
    values = [
        start_alloc,
        init_alloc,
        init_peak,
        memory["before_alloc"],
        memory["before_peak"],
        memory["after_alloc"],
        memory["after_peak"],
        _mb(state_bytes),
    ]
    worst = slowest_rank(values, ctx)  # memory: max over ranks
    row = summarize_slowest(times, ctx)
    row.update(
        {
            "mem_start_mb": worst[0],
            "mem_init_allocated_mb": worst[1],
            "mem_init_peak_mb": worst[2],
            "mem_before_step_allocated_mb": worst[3],
            "mem_before_step_peak_mb": worst[4],
            "mem_after_step_allocated_mb": worst[5],
            "mem_after_step_peak_mb": worst[6],
            "optimizer_state_mb": worst[7],
            "params_mb": params_mb,
            "grads_mb": memory["grads_mb"],
            "num_params": sum(p.numel() for p in model.parameters()),
            "optimizer": optimizer_impl(optimizer),
        }
    )
    ddp.remove_hooks()
    return row


def run_sharding(args, ctx) -> list[dict]:
    from cs336_systems.core.harness import run_point
    from cs336_systems.parallel.launch import write_rows

    rows = []
    for sharded in (False, True):
        variant = "sharded" if sharded else "unsharded"
        with point(variant):
            res = run_point(lambda s=sharded: _memory_point(args, ctx, s))
        rows.append(
            {
                "variant": variant,
                "bucket_size_mb": None,
                "status": res.status,
                **(res.value or {}),
            }
        )
        if ctx.is_main:
            r = rows[-1]
            with point(variant):
                log.log(
                    status_level(r["status"]),
                    "%s step %.2f ms, peak after step %.0f MB, optimizer state %.0f MB",
                    r["status"],
                    r.get("step_ms_mean", math.nan),
                    r.get("mem_after_step_peak_mb", math.nan),
                    r.get("optimizer_state_mb", math.nan),
                )
        write_rows(rows, args.result, ctx)
    return rows


def worker(args) -> None:
    import torch

    from cs336_systems.parallel.launch import finalize_worker, init_worker

    if args.matmul_precision:
        torch.set_float32_matmul_precision(args.matmul_precision)
    ctx = init_worker(args.backend, timeout_s=args.timeout_s)
    with point(args.kind, args.backend, f"n={ctx.world_size}", args.size):
        if args.kind == "variants":
            run_variants(args, ctx)
        else:
            run_sharding(args, ctx)
    finalize_worker()


# ---- parent --------------------------------------------------------------------------------

# and the peer, PyTorch's DistributedDataParallel (stages/ddp/peer.py), run last
VARIANTS = ("naive", "flat", "overlap", "bucketed", "torch_ddp")


def planned_points(args) -> list[dict]:
    if args.kind == "sharding":
        return [{"variant": v, "bucket_size_mb": None} for v in ("unsharded", "sharded")]
    points = [{"variant": "baseline", "bucket_size_mb": None}] if args.baseline else []
    points += [
        {"variant": v, "bucket_size_mb": None}
        for v in args.variants
        if v not in ("bucketed", "torch_ddp")
    ]
    if "bucketed" in args.variants:
        points += [{"variant": "bucketed", "bucket_size_mb": b} for b in args.bucket_sizes_mb]
    if "torch_ddp" in args.variants:
        points += [{"variant": "torch_ddp", "bucket_size_mb": PEER_BUCKET_MB}]
    return points


# AdamW's learning rate and the runs' seed: not knobs (a step's time does not depend on them)
LR = 1e-4
SEED = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's kind, where its rows go and what they say they come
    from) and the stage's knobs as one value (`--block`: its preset block, `DdpKnobs`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("variants", "sharding"))
    add_run_arguments(ap)
    add_block_argument(ap, DdpKnobs)
    ap.add_argument("--no-baseline", dest="baseline", action="store_false")
    # the compute-only baseline alone (a launch on one process where DDP cannot run)
    ap.add_argument("--only-baseline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", default="", help="keep the profiled steps' Chrome traces here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.worker and args.out is None:
        ap.error("--out is required")
    return with_knobs(args)


def with_knobs(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with each knob of its block as the attribute the stage reads."""
    k: DdpKnobs = args.block
    args.backend, args.world_size, args.size = k.backend, k.world_size, k.size
    args.context_length, args.batch_per_rank = k.context_length, k.batch_per_rank
    args.variants = [] if args.only_baseline else list(k.variants)
    args.bucket_sizes_mb = list(k.bucket_sizes_mb)
    args.warmup, args.steps = k.warmup_steps, k.measure_steps
    args.matmul_precision, args.timeout_s = k.matmul_precision, k.timeout_s
    # one profiled step of some variants: the variants job's only
    args.profile = k.profile and args.kind == "variants"
    args.topology, args.nnodes = k.launcher.topology, k.launcher.nnodes
    args.env = {key: str(v) for key, v in k.env.items()}
    args.lr, args.seed = LR, SEED
    return args


def worker_argv(args) -> list[str]:
    """A worker's arguments: the same block (with the launch's changes) and the run's own."""
    block = dataclasses.replace(args.block, profile=args.profile)
    argv = [args.kind, "--worker", f"--machine={args.machine}", f"--preset={args.preset}"]
    argv += [f"--edition={args.edition}", "--block", block_text(block.as_block())]
    if not args.variants:  # the block's variants stay a valid list; the launch runs none
        argv.append("--only-baseline")
    if not args.baseline:
        argv.append("--no-baseline")
    if args.trace_dir:
        argv.append(f"--trace-dir={os.path.abspath(args.trace_dir)}")
    return argv


def _launch(args, world_size: int, planned: list[dict], **overrides) -> list[dict]:
    import copy

    from cs336_systems.parallel.launch import Topology, fill_missing, launch

    run_args = copy.copy(args)
    for key, value in overrides.items():
        setattr(run_args, key, value)
    nproc = max(1, world_size // args.nnodes)
    nnodes = args.nnodes if world_size >= args.nnodes else 1
    with point(args.kind, args.backend, f"n={world_size}", args.size):
        result = launch(
            "cs336_systems.stages.ddp.measure",
            worker_argv(run_args),
            Topology(nproc, nnodes, args.topology if nnodes > 1 else "local"),
            timeout_s=args.timeout_s,
            extra_env=args.env,
        )
    failure = result.status if result.status != "ok" else "error: no result from workers"
    return fill_missing(planned, result.rows, POINT_KEYS, failure)


def run(args) -> list[dict]:
    """All rows of one job (without provenance)."""
    from cs336_systems.core.device import gpu_count
    from cs336_systems.parallel.launch import feasibility

    planned = planned_points(args)
    reason = feasibility(args.backend, args.world_size, args.nnodes)
    if reason is None and args.world_size % args.nnodes:
        reason = f"skipped: world size {args.world_size} not divisible by {args.nnodes} nodes"
    if reason is None:
        rows = _launch(args, args.world_size, planned)
    else:
        rows = [{**p, "status": reason} for p in planned]
        # the compute-only baseline needs one process only: measure it where DDP cannot run
        can_one = args.backend == "gloo" or gpu_count() >= 1
        if args.kind == "variants" and args.baseline and can_one:
            base = _launch(args, 1, planned[:1], variants=[], profile=False)
            rows = base + rows[1:]
    from cs336_systems.core.costs import param_count
    from cs336_systems.model import VOCAB_SIZE, size_spec

    spec = size_spec(args.size, args.edition)
    for row in rows:
        row.update(
            {
                "kind": args.kind,
                "backend": args.backend,
                "device": "cuda" if args.backend == "nccl" else "cpu",
                "world_size": args.world_size,
                "nnodes": args.nnodes,
                "size": args.size,
                "params": param_count(
                    VOCAB_SIZE, spec["d_model"], spec["num_layers"], spec["d_ff"]
                ),
                "context_length": args.context_length,
                "batch_per_rank": args.batch_per_rank,
                "warmup_steps": args.warmup,
                "measure_steps": args.steps,
                "matmul_precision": args.matmul_precision,
            }
        )
    return rows


COLUMNS_FIRST = [
    "kind",
    "backend",
    "device",
    "world_size",
    "nnodes",
    "size",
    "params",
    "context_length",
    "batch_per_rank",
    "variant",
    "bucket_size_mb",
    "optimizer",
    "status",
]


def main(argv: list[str] | None = None) -> None:
    from cs336_systems.parallel.launch import stage_main

    args = parse_args(argv)
    stage_main("ddp", args, worker, lambda: run(args), COLUMNS_FIRST)


if __name__ == "__main__":
    main()
