"""Stage `fsdp`: one training step of the same model under DDP, optimizer-state sharding and FSDP
(fp32 and bf16 compute), measured on every rank.

    python -m cs336_systems.stages.fsdp --machine M --preset gpu --block '{...}' --out F.csv

One launch runs the variants one after the other, each on a freshly built model (rank
0's, broadcast by the wrapper) with AdamW (fused on CUDA, foreach on the CPU: the `optimizer`
column):

- `ddp`, `ddp_bf16`: the overlapped per-parameter DDP wrapper, full AdamW on every rank, in fp32
  and under bf16 autocast (fp32 weights cast to bf16 for each matmul);
- `sharded_optimizer`: the DDP wrapper with `ShardedOptimizer` (ZeRO-1's partitioning);
- `fsdp`, `fsdp_bf16`: `FSDP(model)` and `FSDP(model, compute_dtype=torch.bfloat16)`, units of
  a block (parallel/fsdp.py);
- `fsdp_layer`, `fsdp_bf16_layer`: the same with units of one layer (each Linear gathered and
  reduced alone);
- `ddp_bf16_compiled`, `fsdp_bf16_compiled`: `ddp_bf16` and `fsdp_bf16` with each block's
  ``forward`` compiled (torch.compile; the wrappers' hooks, FSDP's gathers, stay eager around
  it): fewer, larger kernels and less host time a block, where the eager bf16 forward of the
  xl is host-bound. (Per-layer units hook inside a block, where a compiled forward would break
  at every hook: they run eager.)
- `ddp_bf16_graphed`, `fsdp_bf16_graphed`: the compiled pair with the step's forward (and loss)
  and backward (and the wrapper's gradient synchronization, its collectives included) captured
  as two CUDA graphs after two eager steps (core/graphs.py), replayed each step: the host issues
  two launches instead of every kernel and hook, so the GPU no longer waits for FSDP's per-unit
  host work. The graphs keep what a step frees reserved: their rows' allocator peaks miss it
  (`mem_reserved_mb` holds it). GPU only.
- `torch_fsdp_bf16`, `torch_fsdp_bf16_compiled`: the peer, PyTorch's FSDP2 (`fully_shard`) set
  up as ours is by block with bf16 compute (stages/fsdp/peer.py); its collectives bypass
  `parallel.collectives`, so its calls and bytes are not counted.

Per variant: warm-up and measured steps split into forward, backward, `comm` (the gradient
communication left after backward: `finish_gradient_synchronization`) and the optimizer step,
each statistic over the slowest rank per step; one step under the counting collectives (calls
and bytes per kind); one step under torch.profiler (every rank's Chrome trace kept with
`--trace-dir`, a folder per variant), from
which `profiling/overlap.py` computes the all-gather and all communication time on the timeline
and the part of it during compute (GPU: NCCL kernels against other kernels; CPU: gloo's worker
threads against the main thread's ATen operators); and one step with memory marks; the profiled step's wall time on the device timeline split
into compute, exposed communication and idle time (`prof_step_ms`, `prof_gpu_busy_ms`:
profiling/timeline.py; a step whose GPU idles most of it is host-bound). Memory per
rank, max over ranks: the CUDA allocator's allocated and peak bytes after construction, the
peaks of forward and of backward, allocated before and after the optimizer step (NaN on the
CPU), and on every device the bytes of the tensors each rank holds (parameters, gradients,
optimizer state, FSDP's most gathered weights at once).

Where the machine cannot run it (too few GPUs) every point is a `skipped: needs N GPUs, found M`
row whose `command` column holds the exact command that runs it.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import get_args

from cs336_systems.core.costs import MiB
from cs336_systems.core.harness import StepClock, Stopwatch, synchronize, time_marked_steps
from cs336_systems.parallel.launch import (
    parse_stage_args,
    stage_command,
    summarize_slowest,
    worker_argv,
)
from cs336_systems.planning.log import get_logger, point, status_level
from cs336_systems.profiling.overlap import MarkRanges, profile_step, rank_trace
from cs336_systems.stages.fsdp.plan import FsdpKnobs, Variant

VARIANTS = get_args(Variant)
COMPILED = "_compiled"  # the suffix of a variant whose blocks' forward is compiled
GRAPHED = "_graphed"  # compiled blocks, and the step's forward and backward as CUDA graphs
POINT_KEYS = ("variant",)
# the parts of a step, between the marks `training_step` sets
SPANS = {
    "fwd": ("start", "forward"),
    "bwd": ("forward", "backward"),
    "comm": ("backward", "synced"),
    "opt": ("synced", "stepped"),
}
# AdamW's learning rate and the runs' seed: not knobs (a step's time does not depend on them)
LR = 1e-4
SEED = 0
log = get_logger(__name__)


def _mb(nbytes: float) -> float:
    return nbytes / MiB


# ---- worker --------------------------------------------------------------------------------


def param_split(model, wrapper) -> tuple[int, int, int]:
    """(parameters FSDP shards, the others, padding elements per rank), each shared tensor
    once: as the wrapper grouped them (units of a block shard their norm gains too), or, for
    the DDP variants, as FSDP by block would."""
    total = sum(p.numel() for p in model.parameters())
    if getattr(wrapper, "is_peer", False):
        return total, 0, math.nan  # the peer shards every parameter; its padding is its own
    flats = getattr(wrapper, "sharded", None)
    if flats is None:  # DDP: what FSDP by block would shard
        from cs336_systems.parallel.fsdp_units import blocks, is_shardable

        shard = {id(p): p.numel() for _, b in blocks(model) for p in b.parameters()}
        for m in model.modules():
            if is_shardable(m):
                shard.setdefault(id(m.weight), m.weight.numel())
        n = sum(shard.values())
        return n, total - n, 0
    members = sum(m.numel for f in flats for m in f.members)
    pad = sum(f.shard_numel for f in flats) - math.ceil(members / wrapper.world_size)
    replicated = sum(p.numel() for p in getattr(wrapper, "replicated", []))
    return members, replicated, pad


def optimizer_name(device) -> str:
    """The AdamW implementation every variant runs: fused kernels on CUDA, foreach on the CPU."""
    return "adamw_fused" if device.type == "cuda" else "adamw_foreach"


def build_variant(variant: str, args, ctx):
    """(model, wrapper, optimizer, (sharded, replicated, padding) counts) of one variant."""
    import torch

    from cs336_systems.core.own_model import module_for, repeated_blocks
    from cs336_systems.parallel.ddp import DDPOverlapIndividual
    from cs336_systems.parallel.fsdp import FSDP
    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    k: FsdpKnobs = args.block
    compiled = variant.endswith((COMPILED, GRAPHED))
    variant = variant.removesuffix(COMPILED).removesuffix(GRAPHED)
    torch.manual_seed(SEED)
    with ctx.device:  # initialize on the device: a 2.7B model built on the host takes minutes
        model = module_for(k.size, k.context_length, args.edition)  # an own model's name too
    adamw = {"lr": LR, "weight_decay": 0.01}
    adamw.update(fused=True) if ctx.device.type == "cuda" else adamw.update(foreach=True)
    if variant.startswith("torch_fsdp"):
        from cs336_systems.stages.fsdp.peer import TorchFSDP

        wrapper = TorchFSDP(model, torch.bfloat16)
        optimizer = torch.optim.AdamW(wrapper.parameters(), **adamw)
    elif variant in ("ddp", "ddp_bf16", "sharded_optimizer"):
        wrapper = DDPOverlapIndividual(model)
        if variant == "sharded_optimizer":
            optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, **adamw)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), **adamw)
    else:
        dtype = torch.bfloat16 if "bf16" in variant else None
        units = "layer" if variant.endswith("_layer") else "block"
        wrapper = FSDP(model, compute_dtype=dtype, units=units)
        optimizer = torch.optim.AdamW(wrapper.parameters(), **adamw)
    if compiled:
        from cs336_systems.core.device import allow_recompiles

        allow_recompiles()  # each wrapper and dtype is a new specialisation of the forward
        _, blocks = repeated_blocks(model) or ("", [])  # an own model's largest ModuleList
        for block in blocks:  # the forward only: the wrappers' hooks stay eager
            block.forward = torch.compile(block.forward)
    return model, wrapper, optimizer, param_split(model, wrapper)


def _loss(wrapper, x, y, autocast_bf16: bool):
    import torch.nn.functional as F

    from cs336_systems.core.device import autocast
    from cs336_systems.core.own_model import logits_of

    with autocast("bf16" if autocast_bf16 else "fp32", x.device):
        logits = logits_of(wrapper, x)  # an own model's output (HuggingFace's) read too
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


def graph_step(wrapper, optimizer, x, y, autocast_bf16=False):
    """The step's forward and backward (with the gradient synchronization) as CUDA graphs."""
    from cs336_systems.core.graphs import GraphedStep

    def backward(loss) -> None:
        loss.backward()
        wrapper.finish_gradient_synchronization()

    return GraphedStep(
        lambda: _loss(wrapper, x, y, autocast_bf16),
        backward,
        lambda: optimizer.zero_grad(set_to_none=True),
    )


def _training_step(
    wrapper,
    optimizer,
    x,
    y,
    marks: Callable[[str], None] | None = None,
    autocast_bf16=False,
    graphed=None,
    losses: list | None = None,
):
    """One step as marked parts; with `graphed` (a captured GraphedStep) its forward and
    backward replayed (the synchronization inside the backward graph: `comm` is ~0) and the
    gradients kept for the next replay to overwrite. `losses` collects each step's loss."""

    def step(clock: StepClock) -> None:
        def mark(name: str) -> None:
            clock.mark(name)
            if marks is not None:
                marks(name)

        mark("start")
        loss = graphed.forward() if graphed else _loss(wrapper, x, y, autocast_bf16)
        mark("forward")
        graphed.backward() if graphed else loss.backward()
        mark("backward")
        if not graphed:
            wrapper.finish_gradient_synchronization()
        mark("synced")
        optimizer.step()
        mark("stepped")
        if not graphed:
            optimizer.zero_grad(set_to_none=True)
        if losses is not None:
            losses.append(loss.detach().clone())
        clock.mark("end")

    return step


def timed_steps(step, warmup: int, steps: int, device, wrapper) -> dict[str, list[float]]:
    """The whole step and its parts (SPANS) per measured step; for FSDP also the host time
    blocked on gathers (`gather_wait`; on GPU only the time to enqueue the stream wait)."""
    fsdp = hasattr(wrapper, "gather_wait_s")
    waits: list[float] = []

    def counted(clock: StepClock) -> None:
        if fsdp:
            wrapper.reset_peak()
        step(clock)
        if fsdp:
            waits.append(wrapper.gather_wait_s * 1e3)

    out = time_marked_steps(counted, warmup, steps, device, SPANS)
    if fsdp:
        out["gather_wait"] = waits[warmup:]
    return out


def _state_bytes(optimizer) -> int:
    import torch

    from cs336_systems.stages.fsdp.peer import local

    inner = getattr(optimizer, "local_optimizer", None) or optimizer
    return sum(
        local(v).numel() * v.element_size()
        for st in inner.state.values()
        for v in st.values()
        if torch.is_tensor(v)
    )


def _allocated(device) -> tuple[float, float]:
    """(allocated, peak allocated) MiB on a CUDA device; NaN elsewhere."""
    import torch

    if device.type != "cuda":
        return math.nan, math.nan
    return _mb(torch.cuda.memory_allocated(device)), _mb(torch.cuda.max_memory_allocated(device))


def _timed(variant: str, wrapper, optimizer, x, y, k: FsdpKnobs, device):
    """The variant's warm-up and measured steps, then one step under the counting collectives
    (a graphed variant: its graphs captured first, under them). Returns (the step builder, the
    captured graphs or None, the times, the counted traffic, extra columns)."""
    from cs336_systems.parallel import collectives

    bf16 = variant.startswith("ddp_bf16")
    graphed, losses, extra = None, [], {}
    counted = collectives.counting()
    if variant.endswith(GRAPHED):
        if device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device (nccl backend)")
        graphed = graph_step(wrapper, optimizer, x, y, autocast_bf16=bf16)
        with Stopwatch() as sw:
            graphed.warm_up()
            if hasattr(wrapper, "reset_peak"):
                wrapper.reset_peak()
            with counted as counter:  # the collectives the graphs replay, once each
                graphed.capture()
        extra["graph_capture_s"] = sw.s
    training_step = functools.partial(_training_step, autocast_bf16=bf16, graphed=graphed)
    times = timed_steps(
        training_step(wrapper, optimizer, x, y, losses=losses),
        k.warmup_steps,
        k.measure_steps,
        device,
        wrapper if graphed is None else None,
    )
    extra["loss_last"] = losses[-1].item()
    if graphed is None:
        with counted as counter:
            training_step(wrapper, optimizer, x, y)(StepClock(device))
    traffic = {
        f"{kind}_{key}": value
        for kind, c in counter.totals().items()
        for key, value in (("calls", c["calls"]), ("mb", _mb(c["bytes"])))
    }
    if getattr(wrapper, "is_peer", False):  # its collectives bypass the counting ones
        traffic = {"collectives_counted": False}
    return training_step, graphed, times, traffic, extra


def _memory_marks(memory: dict, wrapper, device) -> Callable[[str], None]:
    """Marks that put the allocator's allocated and peak bytes after forward, backward (and
    sync) and the optimizer step, and the gradients' bytes, into `memory`."""
    import torch

    from cs336_systems.stages.fsdp.peer import local

    cuda = device.type == "cuda"

    def marks(name: str) -> None:
        synchronize(device)
        if name == "start" and cuda:
            torch.cuda.reset_peak_memory_stats(device)
        elif name in ("forward", "synced", "stepped"):
            key = {"forward": "fwd", "synced": "bwd", "stepped": "step"}[name]
            memory[f"{key}_alloc"], memory[f"{key}_peak"] = _allocated(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
        if name == "synced":
            memory["grads"] = sum(
                local(p.grad).numel() * p.grad.element_size()
                for p in wrapper.parameters()
                if p.grad is not None
            )

    return marks


def _memory_step(training_step, graphed, wrapper, optimizer, x, y, device) -> tuple[dict, int]:
    """One step with memory marks: (what the marks recorded, FSDP's most gathered bytes)."""
    memory: dict[str, float] = {}
    if graphed is not None:  # the hooks ran at capture: what they gathered at most
        gathered = getattr(wrapper, "peak_resident_bytes", 0)
    elif hasattr(wrapper, "reset_peak"):
        wrapper.reset_peak()
    training_step(wrapper, optimizer, x, y, _memory_marks(memory, wrapper, device))(
        StepClock(device)
    )
    if graphed is None:
        gathered = getattr(wrapper, "peak_resident_bytes", 0)
    return memory, gathered


def _profiled(training_step, variant: str, wrapper, optimizer, x, y, args, ctx) -> dict:
    """One step under torch.profiler (the `profile` knob), every rank's Chrome trace kept in
    one folder with `--trace-dir` (`rank_trace`); {} without the knob."""
    if not args.block.profile:
        return {}
    trace = rank_trace(args.trace_dir, f"fsdp_{variant}", ctx.rank)
    # the step's window for the timeline figure (figures.py), kept whatever keep_raw says
    tl = ctx.is_main and getattr(args, "timeline_dir", "")
    timeline = Path(args.timeline_dir) / f"fsdp_{variant}_rank0.timeline.json.gz" if tl else None
    profiled = profile_step(
        # the step's phases as ranges: the timeline figure's forward window
        training_step(wrapper, optimizer, x, y, MarkRanges()),
        ctx.device,
        trace,
        per_collective=True,
        forward_gathers=getattr(wrapper, "forward_gathers", None),
        timeline_path=timeline,
    )
    profiled["trace"] = trace.parent.name if trace else ""
    profiled["timeline"] = timeline.name if timeline is not None and timeline.exists() else ""
    return profiled


# the memory columns of a row, each the max over ranks (MiB)
MEMORY_COLUMNS = (
    "mem_init_allocated_mb",
    "mem_init_peak_mb",
    "mem_forward_peak_mb",
    "mem_backward_peak_mb",
    "mem_before_step_allocated_mb",
    "mem_after_step_allocated_mb",
    "mem_step_peak_mb",
    "params_mb",
    "grads_mb",
    "optimizer_state_mb",
    "gathered_peak_mb",
    "mem_reserved_mb",
)


def _memory_columns(init, memory: dict, gathered, wrapper, optimizer, ctx) -> dict:
    """MEMORY_COLUMNS, the max over ranks of this rank's numbers."""
    import torch

    from cs336_systems.parallel.launch import slowest_rank
    from cs336_systems.stages.fsdp.peer import local

    device = ctx.device
    params = sum(local(p).numel() * p.element_size() for p in wrapper.parameters())
    values = [
        *init,
        memory["fwd_peak"],
        memory["bwd_peak"],
        memory["bwd_alloc"],
        memory["step_alloc"],
        memory["step_peak"],
        _mb(params),
        _mb(memory["grads"]),
        _mb(_state_bytes(optimizer)),
        _mb(gathered),
        _mb(torch.cuda.memory_reserved(device)) if device.type == "cuda" else math.nan,
    ]
    worst = slowest_rank(values, ctx)  # memory: max over ranks
    return dict(zip(MEMORY_COLUMNS, worst, strict=True))


def measure_variant(variant: str, args, ctx) -> dict:
    import torch

    from cs336_systems.core.workload import rank_batch

    k: FsdpKnobs = args.block
    device = ctx.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model, wrapper, optimizer, (sharded, replicated, pad) = build_variant(variant, args, ctx)
    init = _allocated(device)
    x, y = rank_batch(SEED, ctx.rank, k.batch_per_rank, k.context_length, device)
    try:
        step, graphed, times, traffic, extra = _timed(variant, wrapper, optimizer, x, y, k, device)
        memory, gathered = _memory_step(step, graphed, wrapper, optimizer, x, y, device)
        profiled = _profiled(step, variant, wrapper, optimizer, x, y, args, ctx)
        memory_columns = _memory_columns(init, memory, gathered, wrapper, optimizer, ctx)
        # the profile's numbers are rank 0's, as its timeline; every rank keeps its trace
        row = summarize_slowest(times, ctx)
        row.update(memory_columns)
        row["held_mb"] = row["params_mb"] + row["grads_mb"] + row["optimizer_state_mb"]
        row.update(traffic)
        row.update(profiled)
        row.update(extra)
        row.update({"sharded_params": sharded, "replicated_params": replicated})
        row.update(fsdp_pad_elems=pad, optimizer=optimizer_name(device))
        row.update(fsdp_units=getattr(wrapper, "units_kind", ""))
        row.update(
            fsdp_reduce_window=getattr(wrapper, "reduce_window", math.nan),
            fsdp_reduce_in_flight_peak=getattr(wrapper, "peak_reduce_in_flight", math.nan),
        )
        return row
    finally:
        if hasattr(wrapper, "remove_hooks"):
            wrapper.remove_hooks()


def worker(args) -> None:
    import torch

    from cs336_systems.core.harness import run_point
    from cs336_systems.parallel.launch import finalize_worker, init_worker, write_rows

    k: FsdpKnobs = args.block
    torch.set_float32_matmul_precision(k.matmul_precision)
    ctx = init_worker(k.backend, timeout_s=k.timeout_s)
    rows: list[dict] = []
    for variant in k.variants:
        with point(variant), Stopwatch() as sw:
            res = run_point(lambda v=variant: measure_variant(v, args, ctx))
            rows.append({"variant": variant, "status": res.status, **(res.value or {})})
            if ctx.is_main:
                r = rows[-1]
                log.log(
                    status_level(r["status"]),
                    "%s, step %.2f ms, held %.1f MiB per rank (%.1f s)",
                    r["status"],
                    r.get("step_ms_mean", math.nan),
                    r.get("held_mb", math.nan),
                    sw.s,
                )
        write_rows(rows, args.result, ctx)
    finalize_worker()


# ---- parent --------------------------------------------------------------------------------


def _own_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trace-dir", default="", help="keep the profiled steps' Chrome traces here")
    ap.add_argument("--timeline-dir", default="", help="the profiled steps' timeline windows")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (where its rows go and what they say they come from) and the
    stage's knobs as one value (`--block`: its preset block, `FsdpKnobs`)."""
    return parse_stage_args(FsdpKnobs, argv, __doc__.splitlines()[0], _own_arguments)


def _launch(args, planned: list[dict]) -> list[dict]:
    """Rows of `planned` from one launch of the workers (the same block, `--trace-dir`)."""
    from cs336_systems.parallel.launch import Topology, fill_missing, launch

    k: FsdpKnobs = args.block
    own = [f"--trace-dir={os.path.abspath(args.trace_dir)}"] if args.trace_dir else []
    if getattr(args, "timeline_dir", ""):
        own.append(f"--timeline-dir={os.path.abspath(args.timeline_dir)}")
    with point(k.backend, f"n={k.world_size}", k.size):
        result = launch(
            "cs336_systems.stages.fsdp.measure",
            worker_argv(args, own),
            Topology(k.world_size),
            timeout_s=k.timeout_s,
            extra_env=k.env,
        )
    failure = result.status if result.status != "ok" else "error: no result from workers"
    return fill_missing(planned, result.rows, POINT_KEYS, failure)


def run(args, argv: list[str] | None = None) -> list[dict]:
    """All rows of the job (without provenance)."""
    from cs336_systems.parallel.launch import feasibility

    k: FsdpKnobs = args.block
    planned = [{"variant": v} for v in k.variants]
    reason = feasibility(k.backend, k.world_size)
    if reason is None:
        rows = _launch(args, planned)
    else:
        rows = [{**p, "status": reason} for p in planned]
        log.warning("%s; the command that runs it: %s", reason, stage_command("fsdp", argv))
    # the model the size names, or an own model's name, factory and parameters (workload.py
    # imports torch: not before the launch)
    from cs336_systems.core.workload import model_columns

    model = model_columns(k.size, args.edition, context_length=k.context_length)
    model = {c: model[c] for c in model if c not in ("edition", "num_heads")}
    for row in rows:
        row.update(
            {
                "backend": k.backend,
                "device": "cuda" if k.backend == "nccl" else "cpu",
                "world_size": k.world_size,
                **model,
                "context_length": k.context_length,
                "batch_per_rank": k.batch_per_rank,
                "warmup_steps": k.warmup_steps,
                "measure_steps": k.measure_steps,
                "matmul_precision": k.matmul_precision,
                "command": stage_command("fsdp", argv),
            }
        )
    return rows


COLUMNS_FIRST = [
    "backend",
    "device",
    "world_size",
    "size",
    "params",
    "context_length",
    "batch_per_rank",
    "variant",
    "status",
]


def main(argv: list[str] | None = None) -> None:
    from cs336_systems.parallel.launch import stage_main

    args = parse_args(argv)
    stage_main("fsdp", args, worker, lambda: run(args, argv), COLUMNS_FIRST)


if __name__ == "__main__":
    main()
