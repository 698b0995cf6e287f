"""All-reduce benchmark: time, algorithmic and bus bandwidth per backend, world size and size.

One job measures one backend at several world sizes: for each, the parent checks that the
machine can run it (gloo: one CPU core per process; NCCL: one GPU per process), launches the
workers (parallel/launch.py) with a timeout, and adds a row per message size to one tidy CSV. A world
size the machine cannot run gives rows with status `skipped: <reason>`.

Each worker, per message size (float32, MiB = 2**20 bytes; the knob `sizes_mb` holds MiB):
1. correctness: rank r contributes `base * (r + 1)` (`base` uniform random, the same on every
   rank), the sum must be `base * n (n + 1) / 2`; a wrong sum is an `error:` row, never timed;
2. warm-up all-reduces, then `repeats` samples, each `inner` back-to-back all-reduces after a
   reset of the buffer and a barrier (`inner` so that a sample lasts ~`sample_ms` and the sums
   cannot overflow), timed with CUDA events on GPU and the host clock on CPU;
3. per sample, the slowest rank's time per all-reduce; mean/std/median over samples.

Bandwidths as nccl-tests defines them (GB = 1e9 bytes): algbw = size / time,
busbw = algbw * 2 (n - 1) / n (the bytes each rank's link carries in a ring all-reduce).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from cs336_systems.core.costs import MiB, ring_all_reduce_time
from cs336_systems.core.harness import StepClock, summarize, synchronize
from cs336_systems.parallel.launch import feasibility, parse_stage_args, worker_argv
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.stages.allreduce.plan import AllreduceKnobs

BACKENDS = ("gloo", "nccl")
POINT_KEYS = ("buffers", "size_mb")
# default: tensors from PyTorch's caching allocator; registered: from NCCL's allocator in a
# memory pool registered with the communicator (NCCL user-buffer registration, zero-copy paths)
BUFFERS = ("default", "registered")
# the seed of the messages' values: not a knob (a time does not depend on it)
SEED = 0

log = get_logger(__name__)


def sizes_of(args) -> list[float]:
    """The job's message sizes (MiB): its backend's."""
    return list(getattr(args.block.sizes_mb, args.backend))


def buffers_of(args) -> list[str]:
    """The buffers the job times: buffers from NCCL's allocator are NCCL's only."""
    return list(args.block.nccl_buffers) if args.backend == "nccl" else ["default"]


def algbw_gbps(nbytes: float, time_ms: float) -> float:
    """Algorithmic bandwidth: message bytes / time, in GB/s (1e9 bytes)."""
    if not time_ms or time_ms <= 0 or math.isnan(time_ms):
        return float("nan")
    return nbytes / (time_ms * 1e-3) / 1e9


def busbw_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2 (n - 1) / n: the ring all-reduce's bytes
    on each rank's link per byte reduced (core/costs.py's ring time at S = W = 1)."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return ring_all_reduce_time(1.0, world_size, 1.0)


def busbw_gbps(nbytes: float, time_ms: float, world_size: int) -> float:
    return algbw_gbps(nbytes, time_ms) * busbw_factor(world_size)


def check_sum(result, base, world_size: int, rtol: float = 1e-5) -> tuple[bool, float]:
    """Is `result` the all-reduce sum of `base * (r + 1)` over r < world_size?

    Returns (ok, max relative error)."""
    expected = base * (world_size * (world_size + 1) / 2)
    err = ((result - expected).abs() / expected.abs().clamp_min(1e-6)).max().item()
    return err <= rtol, err


def message_numel(size_mb: float) -> int:
    return int(size_mb * MiB) // 4


# ---- worker --------------------------------------------------------------------------------


def _measure_size(ctx, size_mb: float, k: AllreduceKnobs, buffers: str = "default") -> dict:
    import contextlib

    import torch
    import torch.distributed as dist

    pool, backend = None, None
    if buffers == "registered":
        backend = dist.group.WORLD._get_backend(ctx.device)
        pool = torch.cuda.MemPool(backend.mem_allocator)
    with torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
        numel = message_numel(size_mb)
        gen = torch.Generator(device=ctx.device).manual_seed(SEED)
        base = torch.rand(numel, generator=gen, device=ctx.device, dtype=torch.float32) + 0.5
        src = base * (ctx.rank + 1)
        buf = src.clone()
    if pool is None:
        return _time_allreduce(ctx, size_mb, k, base, src, buf)
    backend.register_mem_pool(pool)
    try:
        return _time_allreduce(ctx, size_mb, k, base, src, buf)
    finally:
        del base, src, buf
        backend.deregister_mem_pool(pool)


def _time_allreduce(ctx, size_mb: float, k: AllreduceKnobs, base, src, buf) -> dict:
    import torch
    import torch.distributed as dist

    from cs336_systems.parallel.launch import slowest_rank

    device = ctx.device
    nbytes = buf.numel() * 4

    # correctness first: never record a time for a wrong result
    dist.all_reduce(buf)
    ok, err = check_sum(buf, base, ctx.world_size)
    worst = slowest_rank([err], ctx)[0]
    row = {"size_mb": size_mb, "bytes": nbytes, "max_rel_err": worst}
    if worst > 1e-5 or not ok:
        return {**row, "status": f"error: wrong sum (max relative error {worst:.2e})"}

    def one(n: int) -> float:
        """ms for n back-to-back all-reduces after a reset and a barrier."""
        buf.copy_(src)
        dist.barrier()
        synchronize(device)
        clock = StepClock(device)  # CUDA events on GPU, the host clock on CPU
        clock.mark("start")
        for _ in range(n):
            dist.all_reduce(buf)
        clock.mark("end")
        return clock.ms("start", "end")  # waits for the end event

    # warm-up: the first calls pay set-up costs; after two, the slowest rank's estimate (the
    # same on every rank, so all ranks agree) caps the rest at half the timing budget
    warm = [one(1) for _ in range(min(2, k.warmup))]
    est = slowest_rank([min(warm[1:] or warm)], ctx)[0]
    more = min(k.warmup - len(warm), int(k.max_seconds_per_size * 1e3 / 2 // max(est, 1e-3)))
    warm += [one(1) for _ in range(max(0, more))]
    est = slowest_rank([min(warm[1:] or warm)], ctx)[0]
    # inner: samples of ~sample_ms; capped so that sums stay finite (n^inner growth)
    cap = max(1, int(30 / math.log2(max(ctx.world_size, 2))))
    inner = int(min(cap, max(1, math.ceil(k.sample_ms / max(est, 1e-3)))))
    budget = k.max_seconds_per_size * 1e3 // max(est * inner, 1e-3)
    repeats = int(min(k.repeats, max(k.min_repeats, budget)))
    samples = [one(inner) / inner for _ in range(repeats)]
    slowest = slowest_rank(samples, ctx)
    finite = bool(torch.isfinite(buf).all().item())
    synchronize(device)
    stats = summarize(slowest, "time")
    t = stats["time_ms_median"]
    row.update(stats)
    row.update(
        {
            "inner": inner,
            "repeats": repeats,
            "warmup": len(warm),
            "algbw_gbps": algbw_gbps(nbytes, t),
            "busbw_gbps": busbw_gbps(nbytes, t, ctx.world_size),
            "algbw_gbps_mean": algbw_gbps(nbytes, stats["time_ms_mean"]),
            "busbw_gbps_mean": busbw_gbps(nbytes, stats["time_ms_mean"], ctx.world_size),
            "status": "ok" if finite else "error: non-finite values after timing",
        }
    )
    return row


def worker(args) -> None:
    from cs336_systems.core.harness import run_point
    from cs336_systems.parallel.launch import finalize_worker, init_worker, write_rows

    k: AllreduceKnobs = args.block
    ctx = init_worker(args.backend, timeout_s=k.timeout_s)
    rows = []
    for buffers, size_mb in [(b, s) for b in buffers_of(args) for s in sizes_of(args)]:
        with point(args.backend, f"n={ctx.world_size}", buffers, f"{size_mb:g} MiB"):
            result = run_point(lambda s=size_mb, b=buffers: _measure_size(ctx, s, k, b))
            row = {"buffers": buffers, "size_mb": size_mb, "status": result.status}
            row.update(result.value or {})
            rows.append(row)
            if ctx.is_main:
                log.log(
                    status_level(row["status"]),
                    "%.4f ms, busbw %.2f GB/s (%s)",
                    row.get("time_ms_median", float("nan")),
                    row.get("busbw_gbps", float("nan")),
                    row["status"],
                )
        write_rows(rows, args.result, ctx)
    finalize_worker()


# ---- parent --------------------------------------------------------------------------------


def _own_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--backend", choices=BACKENDS, required=True, help="the job's backend")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (the job's backend, where its rows go and what they say they come
    from) and the stage's knobs as one value (`--block`: its preset block, `AllreduceKnobs`)."""
    return parse_stage_args(AllreduceKnobs, argv, __doc__.splitlines()[0], _own_arguments)


def memory_shortfall(backend: str, world_size: int, nnodes: int, size_mb: float) -> str | None:
    """A `skipped:` status when a message's buffers (three per rank) cannot fit in this node's
    memory now: the host's for gloo (every rank of the node on it), one GPU's for NCCL."""
    from cs336_systems.planning.machine import host_memory_mib, visible_gpus

    if backend == "gloo":
        ranks = math.ceil(world_size / nnodes)
        need, free, where = 3 * size_mb * ranks, host_memory_mib("MemAvailable"), "the host"
    else:
        ranks, memory = 1, [g.memory_mib for g in visible_gpus() if g.memory_mib]
        need, free, where = 3 * size_mb, min(memory) if memory else None, "a GPU"
    if free is None or need <= free:
        return None
    return (
        f"skipped: {size_mb:g} MiB x 3 buffers x {ranks} ranks needs {need:,.0f} MiB;"
        f" {free:,.0f} MiB on {where}"
    )


def _launch(args: argparse.Namespace, world_size: int, fitting: list[float]):
    """One launch of the workers on `world_size` ranks (its LaunchResult): the same block, with
    the sizes that fit as the backend's."""
    from cs336_systems.parallel.launch import Topology, launch

    k: AllreduceKnobs = args.block
    sizes = dataclasses.replace(k.sizes_mb, **{args.backend: fitting})
    with point(args.backend, f"n={world_size}"):
        result = launch(
            "cs336_systems.stages.allreduce.measure",
            worker_argv(args, [f"--backend={args.backend}"], sizes_mb=sizes),
            Topology(world_size // k.launcher.nnodes, k.launcher.nnodes, k.launcher.topology),
            timeout_s=k.timeout_s,
            extra_env=k.env,
        )
    return result


def rerun_command(args: argparse.Namespace, world_size: int) -> str:
    """The command that measures this job's points at `world_size` alone (on a host that can
    run it): this stage's CLI with the same run, backend and block, one world size."""
    from cs336_systems.parallel.launch import stage_command
    from cs336_systems.planning.knobs import block_text

    block = dataclasses.replace(args.block, world_sizes=[world_size])
    out = Path(args.out or "allreduce.csv")
    argv = [
        f"--machine={args.machine}",
        f"--preset={args.preset}",
        f"--edition={args.edition}",
        f"--backend={args.backend}",
        f"--out={out.with_name(f'{out.stem}_n{world_size}{out.suffix}')}",
        "--block",
        block_text(block.as_block()),
    ]
    return stage_command("allreduce", argv)


def run_world_size(args: argparse.Namespace, world_size: int) -> list[dict]:
    """Measure (or skip) every size at one world size; rows without provenance. gloo runs at
    any world size (processes beyond the cores take turns: `oversubscribed`); a row skipped for
    want of GPUs carries the command that measures it where they exist."""
    from cs336_systems.core.device import available_cores
    from cs336_systems.parallel.launch import fill_missing, oversubscribed

    k: AllreduceKnobs = args.block
    backend, nnodes, sizes = args.backend, k.launcher.nnodes, sizes_of(args)
    planned = [{"buffers": b, "size_mb": s} for b in buffers_of(args) for s in sizes]
    reason = feasibility(backend, world_size, nnodes, oversubscribe=True)
    if reason is None and world_size % nnodes:
        reason = f"skipped: world size {world_size} not divisible by {nnodes} nodes"
    # sizes that cannot fit are rows before anything is launched
    too_big = {}
    if reason is None:
        too_big = {
            s: why for s in sizes if (why := memory_shortfall(backend, world_size, nnodes, s))
        }
    fitting = [s for s in sizes if s not in too_big]
    if reason is not None or not fitting:
        rows = [{**p, "status": reason or too_big[p["size_mb"]]} for p in planned]
    else:
        result = _launch(args, world_size, fitting)
        failure = result.status if result.status != "ok" else "error: no result from workers"
        runs = [p for p in planned if p["size_mb"] in fitting]
        rows = fill_missing(runs, result.rows, POINT_KEYS, failure)
        rows += [{**p, "status": too_big[p["size_mb"]]} for p in planned if p not in runs]
    env_text = ";".join(f"{key}={v}" for key, v in sorted(k.env.items()))
    command = rerun_command(args, world_size) if reason else ""
    for row in rows:
        row.update(
            {
                "backend": backend,
                "device": "cuda" if backend == "nccl" else "cpu",
                "world_size": world_size,
                "nnodes": nnodes,
                "bytes": message_numel(row["size_mb"]) * 4,
                "env": env_text,
                "cpu_cores": available_cores(),
                "oversubscribed": oversubscribed(backend, world_size, nnodes),
                "command": command,
            }
        )
    if reason:
        log.warning("%s; the command that runs it: %s", reason, command)
    return rows


COLUMNS_FIRST = [
    "backend",
    "device",
    "buffers",
    "world_size",
    "nnodes",
    "size_mb",
    "bytes",
    "status",
]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("allreduce")
    if args.worker:
        worker(args)
        return
    from cs336_systems.core.results import provenance_meanwhile, with_columns_first, write_csv
    from cs336_systems.stages.allreduce import nccl_tests

    base = provenance_meanwhile(args.machine, args.preset, args.edition)
    got = [r for n in args.block.world_sizes for r in run_world_size(args, n)]
    rows = [{**base(), **r} for r in got]
    df = with_columns_first(rows, COLUMNS_FIRST)
    write_csv(df, args.out)
    text = nccl_tests.path_beside(args.out)
    text.write_text(nccl_tests.table(df.to_dict("records")))
    log.info("wrote %s: %d rows, and %s (nccl-tests' columns)", args.out, len(df), text.name)


if __name__ == "__main__":
    main()
