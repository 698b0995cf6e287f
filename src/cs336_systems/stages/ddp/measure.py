"""Stage `ddp`: data-parallel training steps with each DDP variant, and optimizer-state sharding.

    python -m cs336_systems.stages.ddp variants --machine M --preset gpu --block '{...}' --out F.csv
    python -m cs336_systems.stages.ddp sharding --machine M --preset gpu --block '{...}' --out F.csv

`variants` (one launch): first the compute-only baseline (forward, backward, AdamW step
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
variant with torch.profiler (every rank's Chrome trace in a folder per step under `--trace-dir`,
`profiling/overlap.py:rank_trace`; rank 0's window for the timeline) and, on GPU,
measures how much of the NCCL kernel time ran while compute kernels ran.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

from cs336_systems.core.costs import MiB
from cs336_systems.core.harness import StepClock, synchronize, time_marked_steps
from cs336_systems.parallel.launch import parse_stage_args, summarize_slowest, worker_argv
from cs336_systems.planning.log import get_logger, point, status_level
from cs336_systems.profiling.overlap import profile_step, rank_trace
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
# AdamW's learning rate and the runs' seed: not knobs (a step's time does not depend on them)
LR = 1e-4
SEED = 0

log = get_logger(__name__)


# ---- the job's runs ------------------------------------------------------------------------


def variants_of(args) -> list[str]:
    """The DDP variants this launch runs: the block's, none in a launch of the compute-only
    baseline alone (`--only-baseline`: the block's list stays valid, the launch runs none)."""
    return [] if args.only_baseline else list(args.block.variants)


def profiled(args) -> bool:
    """Whether the job profiles one step of some variants (the `profile` knob: the variants
    job's only)."""
    return args.block.profile and args.kind == "variants"


def ddp_runs(args) -> list[tuple[str, float | None]]:
    """(variant, bucket size) of each DDP run of the variants job, in the order it runs them:
    the plain variants, bucketed at each bucket size, then the peer (last: the others reuse the
    model it wrapped)."""
    variants = variants_of(args)
    runs = [(v, None) for v in variants if v not in ("bucketed", "torch_ddp")]
    if "bucketed" in variants:
        runs += [("bucketed", b) for b in args.block.bucket_sizes_mb]
    if "torch_ddp" in variants:
        runs += [("torch_ddp", PEER_BUCKET_MB)]
    return runs


# ---- worker --------------------------------------------------------------------------------


def build(args, device):
    import torch

    from cs336_systems.core.own_model import module_for

    k: DdpKnobs = args.block
    torch.manual_seed(SEED)
    with device:  # initialize on the device: an xl model built on the host takes minutes
        return module_for(k.size, k.context_length, args.edition)  # an own model's name too


def timed_steps(
    step: Callable[[StepClock], None], warmup: int, steps: int, device
) -> dict[str, list[float]]:
    """Per measured step: step (host, synchronized), fwd_bwd, comm, opt (events / host)."""
    return time_marked_steps(step, warmup, steps, device, STEP_PARTS)


def training_step(net, optimizer, x, y, ddp=None) -> Callable[[StepClock], None]:
    import torch.nn.functional as F

    from cs336_systems.core.own_model import logits_of

    def step(clock: StepClock) -> None:
        clock.mark("start")
        if ddp is not None:
            ddp.on_train_batch_start()
        logits = logits_of(net, x)  # an own model's output (HuggingFace's) read too
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

    k: DdpKnobs = args.block
    ddp = TorchDDP(model) if variant == "torch_ddp" else wrap(model, variant, bucket)
    try:
        # a fresh optimizer per run: every rank starts it with the same (empty) state
        optimizer = make_optimizer(model, lr=LR)
        times = timed_steps(
            training_step(ddp, optimizer, x, y, ddp), k.warmup_steps, k.measure_steps, ctx.device
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
        optimizer = make_optimizer(model, lr=LR)
        step = training_step(ddp, optimizer, x, y, ddp)
        step(StepClock(ctx.device))  # one unprofiled step: optimizer state, allocator
        name = f"ddp_{variant}" + (f"_{bucket:g}mb" if bucket is not None else "")
        trace = rank_trace(args.trace_dir, name, ctx.rank)  # every rank's, one folder
        # the step's window for the timeline figure (figures.py), kept whatever keep_raw says
        tl = ctx.is_main and getattr(args, "timeline_dir", "")
        timeline = Path(args.timeline_dir) / f"{name}_rank0.timeline.json.gz" if tl else None
        stats = profile_step(step, ctx.device, trace, timeline_path=timeline)
        kept = timeline.name if timeline is not None and timeline.exists() else ""
        return {**stats, "trace": name if trace else "", "timeline": kept}
    finally:
        ddp.remove_hooks()
        model.zero_grad(set_to_none=True)


def _bucket_text(bucket: float | None) -> str:
    return f"bucket {bucket:g} MiB" if bucket is not None else ""


def _baseline(model, args, ctx, x, y) -> dict:
    """The compute-only step (no communication) on rank 0 while the other ranks wait."""
    from cs336_systems.model import make_optimizer, optimizer_impl

    if not ctx.is_main:
        return {}
    k: DdpKnobs = args.block
    optimizer = make_optimizer(model, lr=LR)
    step = training_step(model, optimizer, x, y)
    times = timed_steps(step, k.warmup_steps, k.measure_steps, ctx.device)
    row = summarize_slowest(times, None)
    row["optimizer"] = optimizer_impl(optimizer)
    model.zero_grad(set_to_none=True)
    return row


def _profile_runs(rows: list[dict], model, args, ctx, x, y) -> None:
    """One profiled step of naive, overlap and the fastest bucketed run, into their rows."""
    from cs336_systems.core.harness import run_point
    from cs336_systems.parallel.launch import write_rows

    bucketed = [r for r in rows if r["variant"] == "bucketed" and r["status"] == "ok"]
    best = min(bucketed, key=lambda r: r["step_ms_mean"])["bucket_size_mb"] if bucketed else None
    targets = [("naive", None), ("overlap", None)] + ([("bucketed", best)] if bucketed else [])
    for variant, bucket in targets:
        if variant not in variants_of(args):
            continue
        with point(variant, _bucket_text(bucket), "profile"):
            res = run_point(
                lambda v=variant, b=bucket: profile_variant(model, v, b, args, ctx, x, y)
            )
        for row in rows:
            if (row["variant"], row["bucket_size_mb"]) == (variant, bucket) and res.value:
                row.update(res.value)
        write_rows(rows, args.result, ctx)


def run_variants(args, ctx) -> list[dict]:
    import torch.distributed as dist

    from cs336_systems.core.harness import run_point
    from cs336_systems.core.workload import rank_batch
    from cs336_systems.parallel.launch import write_rows

    k: DdpKnobs = args.block
    model = build(args, ctx.device)
    x, y = rank_batch(SEED, ctx.rank, k.batch_per_rank, k.context_length, ctx.device)
    rows: list[dict] = []

    def record(variant: str, bucket: float | None, res) -> None:
        row = {"variant": variant, "bucket_size_mb": bucket, "status": res.status}
        rows.append({**row, **(res.value or {})})
        if ctx.is_main:
            log.log(
                status_level(rows[-1]["status"]),
                "%s, step %.2f ms, comm %.2f ms",
                rows[-1]["status"],
                rows[-1].get("step_ms_mean", math.nan),
                rows[-1].get("comm_ms_mean", math.nan),
            )
        write_rows(rows, args.result, ctx)

    if args.baseline:
        with point("baseline"):
            res = run_point(lambda: _baseline(model, args, ctx, x, y))
            dist.barrier()
            record("baseline", None, res)
    for variant, bucket in ddp_runs(args):
        with point(variant, _bucket_text(bucket)):
            res = run_point(
                lambda v=variant, b=bucket: measure_variant(model, v, b, args, ctx, x, y)
            )
            record(variant, bucket, res)
    if profiled(args):
        _profile_runs(rows, model, args, ctx, x, y)
    return rows


def _mb(nbytes: float) -> float:
    return nbytes / MiB


def _allocated(device) -> tuple[float, float]:
    """(allocated, peak allocated) MiB on a CUDA device; NaN elsewhere."""
    import torch

    if device.type != "cuda":
        return math.nan, math.nan
    return _mb(torch.cuda.memory_allocated(device)), _mb(torch.cuda.max_memory_allocated(device))


def _reset_peak(device) -> None:
    """Restart the CUDA allocator's peak counter (nothing to restart elsewhere): each of the
    sharding job's three points reads the peak since the previous one, not since the start."""
    import torch

    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _memory_step(ddp, model, optimizer, x, y, device, memory: dict):
    """The sharding job's training step; with `record`, into `memory`: the allocated bytes and
    the peak of forward+backward just before the optimizer step (the peak counter reset at the
    step's start), the same just after the optimizer step (the counter reset right before it,
    so that peak is the optimizer step's own), and the gradients' bytes."""
    import torch.nn.functional as F

    from cs336_systems.core.own_model import logits_of

    def step(clock: StepClock, record: bool = False) -> None:
        if record:
            _reset_peak(device)
        clock.mark("start")
        logits = logits_of(ddp, x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        clock.mark("backward")
        ddp.finish_gradient_synchronization()
        clock.mark("synced")
        if record:
            synchronize(device)
            memory["before_alloc"], memory["before_peak"] = _allocated(device)
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            memory["grads_mb"] = _mb(sum(g.numel() * g.element_size() for g in grads))
            _reset_peak(device)
        optimizer.step()
        if record:
            synchronize(device)
            memory["after_alloc"], memory["after_peak"] = _allocated(device)
        optimizer.zero_grad(set_to_none=True)
        clock.mark("end")

    return step


def _state_mb(optimizer) -> float:
    """The optimizer state this rank holds (the sharded optimizer's: its local optimizer's)."""
    import torch

    inner = getattr(optimizer, "local_optimizer", optimizer)
    state = [v for st in inner.state.values() for v in st.values() if torch.is_tensor(v)]
    return _mb(sum(v.numel() * v.element_size() for v in state))


# the memory columns of a sharding row, each the max over ranks. The three points: after
# building the model and optimizer (peak since the job's start), just before the optimizer step
# of a measured step (peak of its forward+backward: the counter reset at the step's start) and
# just after it (peak of the optimizer step alone: the counter reset right before it)
MEMORY_COLUMNS = (
    "mem_start_mb",
    "mem_init_allocated_mb",
    "mem_init_peak_mb",
    "mem_before_step_allocated_mb",
    "mem_before_step_peak_mb",
    "mem_after_step_allocated_mb",
    "mem_after_step_peak_mb",
    "optimizer_state_mb",
)


def _memory_point(args, ctx, sharded: bool) -> dict:
    import torch

    from cs336_systems.core.workload import rank_batch
    from cs336_systems.model import optimizer_impl
    from cs336_systems.parallel.ddp import DDPOverlapIndividual
    from cs336_systems.parallel.launch import slowest_rank
    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    k: DdpKnobs = args.block
    device = ctx.device
    _reset_peak(device)
    start_alloc, _ = _allocated(device)
    model = build(args, device)
    ddp = DDPOverlapIndividual(model)
    adamw = {"lr": LR, "weight_decay": 0.01, "fused": device.type == "cuda"}
    if sharded:
        optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), **adamw)
    init_alloc, init_peak = _allocated(device)
    x, y = rank_batch(SEED, ctx.rank, k.batch_per_rank, k.context_length, device)
    memory: dict[str, float] = {}
    step = _memory_step(ddp, model, optimizer, x, y, device, memory)
    times = timed_steps(step, k.warmup_steps, k.measure_steps, device)
    step(StepClock(device), record=True)
    values = [start_alloc, init_alloc, init_peak, memory["before_alloc"], memory["before_peak"]]
    values += [memory["after_alloc"], memory["after_peak"], _state_mb(optimizer)]
    worst = slowest_rank(values, ctx)  # memory: max over ranks
    row = summarize_slowest(times, ctx)
    row.update(zip(MEMORY_COLUMNS, worst, strict=True))
    row.update(
        {
            "params_mb": _mb(sum(p.numel() * p.element_size() for p in model.parameters())),
            "grads_mb": memory["grads_mb"],
            "num_params": sum(p.numel() for p in model.parameters()),
            "optimizer": optimizer_impl(optimizer),
            # each peak counts from the previous point (the report reads older rows apart)
            "mem_peaks_reset": device.type == "cuda",
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
                    "%s step %.2f ms, peak in the optimizer step %.0f MiB, optimizer state %.0f MiB",
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

    k: DdpKnobs = args.block
    if k.matmul_precision:
        torch.set_float32_matmul_precision(k.matmul_precision)
    ctx = init_worker(k.backend, timeout_s=k.timeout_s)
    with point(args.kind, k.backend, f"n={ctx.world_size}", k.size):
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
    return points + [{"variant": v, "bucket_size_mb": b} for v, b in ddp_runs(args)]


def _own_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("kind", choices=("variants", "sharding"))
    ap.add_argument("--no-baseline", dest="baseline", action="store_false")
    # the compute-only baseline alone (a launch on one process where DDP cannot run)
    ap.add_argument("--only-baseline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trace-dir", default="", help="keep the profiled steps' Chrome traces here")
    ap.add_argument("--timeline-dir", default="", help="the profiled steps' timeline windows")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's kind, where its rows go and what they say they come
    from) and the stage's knobs as one value (`--block`: its preset block, `DdpKnobs`)."""
    return parse_stage_args(DdpKnobs, argv, __doc__.splitlines()[0], _own_arguments)


def _launch(args, world_size: int, planned: list[dict], only_baseline: bool = False) -> list[dict]:
    """Rows of `planned` from one launch on `world_size` ranks (`only_baseline`: the
    compute-only baseline alone, nothing profiled)."""
    from cs336_systems.parallel.launch import Topology, fill_missing, launch

    k: DdpKnobs = args.block
    own = [args.kind]
    if only_baseline or args.only_baseline:
        own.append("--only-baseline")
    if not args.baseline:
        own.append("--no-baseline")
    if args.trace_dir:
        own.append(f"--trace-dir={os.path.abspath(args.trace_dir)}")
    if getattr(args, "timeline_dir", ""):
        own.append(f"--timeline-dir={os.path.abspath(args.timeline_dir)}")
    argv = worker_argv(args, own, profile=profiled(args) and not only_baseline)
    nnodes = k.launcher.nnodes if world_size >= k.launcher.nnodes else 1
    nproc = max(1, world_size // k.launcher.nnodes)
    with point(args.kind, k.backend, f"n={world_size}", k.size):
        result = launch(
            "cs336_systems.stages.ddp.measure",
            argv,
            Topology(nproc, nnodes, k.launcher.topology if nnodes > 1 else "local"),
            timeout_s=k.timeout_s,
            extra_env=k.env,
        )
    failure = result.status if result.status != "ok" else "error: no result from workers"
    return fill_missing(planned, result.rows, POINT_KEYS, failure)


def _job_columns(args) -> dict:
    """What every row of the job says it ran: the job, the model and the run's lengths."""
    from cs336_systems.core.workload import model_columns

    k: DdpKnobs = args.block
    model = model_columns(k.size, args.edition, context_length=k.context_length)
    model.pop("edition")
    return {
        "kind": args.kind,
        "backend": k.backend,
        "device": "cuda" if k.backend == "nccl" else "cpu",
        "world_size": k.world_size,
        "nnodes": k.launcher.nnodes,
        # the model the size names in this run's edition (2025's xl is not 2026's), or an
        # own model's name, factory and parameters (docs/own-model.md)
        **model,
        "context_length": k.context_length,
        "batch_per_rank": k.batch_per_rank,
        "warmup_steps": k.warmup_steps,
        "measure_steps": k.measure_steps,
        "matmul_precision": k.matmul_precision,
    }


def run(args) -> list[dict]:
    """All rows of one job (without provenance)."""
    from cs336_systems.core.device import gpu_count
    from cs336_systems.parallel.launch import feasibility

    k: DdpKnobs = args.block
    nnodes = k.launcher.nnodes
    planned = planned_points(args)
    reason = feasibility(k.backend, k.world_size, nnodes)
    if reason is None and k.world_size % nnodes:
        reason = f"skipped: world size {k.world_size} not divisible by {nnodes} nodes"
    if reason is None:
        rows = _launch(args, k.world_size, planned)
    else:
        rows = [{**p, "status": reason} for p in planned]
        # the compute-only baseline needs one process only: measure it where DDP cannot run
        can_one = k.backend == "gloo" or gpu_count() >= 1
        if args.kind == "variants" and args.baseline and can_one:
            rows = _launch(args, 1, planned[:1], only_baseline=True) + rows[1:]
    columns = _job_columns(args)
    for row in rows:
        row.update(columns)
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
