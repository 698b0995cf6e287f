"""Stage `leaderboard`: one training step of the 2026 leaderboard model through the engine
(engine/step.py) and through the plain model, on the world size the machine has.

    python -m cs336_systems.stages.leaderboard --machine M --preset gpu --block '{...}' \
        --plans full,reduced --peak-csv ceilings.csv --out L.csv

Configurations (`config` column, `--plans`): `full`, the configured model on `world_size`
ranks (a machine with fewer GPUs writes `skipped` rows with the command that runs it);
`reduced`, on one GPU when the full one cannot run there: the same widths, context and batch
with the most layers the engine fits by the memory model (engine/memory_model.py); `ablation`, the
engine on the full configuration with one optimization turned off per row (the `ablations`
knob, ABLATIONS; column `ablation`). Each row is first checked against the memory model: one that
cannot fit is `skipped: needs X GB per rank, have Y` before anything is allocated. A point that
runs: the seconds from an empty process to the end of the warm-up steps (build, compile, first
steps: `setup_s`), the measured steps (slowest rank per step), tokens/s, TFLOP/s by
core/costs.train_step_flops, MFU against the ceilings stage's measured bf16 peak of the path the
matmuls take (`--peak-csv`; NaN without it) times the world size, peak memory per rank in GiB
(CUDA allocator; NaN on the CPU), the 10-minute rule (engine/leaderboard_rules.py), the checkpointing the
engine chose and what it measured to choose it, and one profiled step's breakdown per rank
(`breakdown_r<rank>_<part>_ms`; rank 0's also as `breakdown_<part>_ms`): on a GPU the step's
wall time on the device timeline, split into the compute parts, exposed communication and idle
time, which add up to it (profiling/timeline.py), with the communication hidden behind compute
beside them; on the CPU the main thread's operator self time by part and the rest (`host`),
which add up to the step's host time.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from cs336_systems.parallel.launch import parse_stage_args, worker_argv
from cs336_systems.planning.log import get_logger, point, status_level
from cs336_systems.stages.leaderboard.mfu import matmul_path, with_path_mfu
from cs336_systems.stages.leaderboard.plan import ABLATIONS, LeaderboardKnobs, pins_checkpointing

log = get_logger(__name__)
PLANS = ("full", "reduced", "ablation")
DIMS = ("vocab", "d_model", "d_ff", "num_layers", "num_heads", "context_length", "batch")
STEP_RANGE = "leaderboard_step"  # the profiled step's record_function range
# 2: the device timeline without the record_function ranges' device-side annotations (which
# version 1 counted as a kernel spanning the step: half of every instant went to "other")
BREAKDOWN_VERSION = 2
# the runs' seed: not a knob (a step's time does not depend on it)
SEED = 0


def engine_checkpointing(path: str) -> str:
    """The checkpointing the full configuration's engine row ran, from the stage's runs CSV
    (empty when that row did not run)."""
    if not path or not Path(path).exists():
        return ""
    from cs336_systems.core.results import read_csv

    df = read_csv(path)
    if "checkpointing" not in df:
        return ""
    rows = df[(df["config"] == "full") & (df["variant"] == "engine") & (df["status"] == "ok")]
    return str(rows["checkpointing"].iloc[0]) if len(rows) else ""


def _profile(step, device) -> dict[str, float]:
    """One profiled step split into parts that add up to it (module doc), in milliseconds:
    `<part>_ms` for each part, `window_ms` the whole; on a GPU also the communication hidden
    behind compute and the optimizer's kernel time (all its kernels, for its byte floor)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from cs336_systems.core.harness import synchronize
    from cs336_systems.engine.leaderboard_rules import classify

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        with record_function(STEP_RANGE):
            step()
        synchronize(device)
    if device.type == "cuda":
        from cs336_systems.profiling.timeline import COMM, gpu_kernels, split_step, step_window

        def compute_part(path: str) -> str:
            # a compute kernel is never communication: a collective's range that the profiler
            # nests around a later launch on the same thread does not make it one
            return classify(" / ".join(p for p in path.split(" / ") if not COMM.search(p)))

        kernels = gpu_kernels(prof)
        window = step_window(prof, STEP_RANGE, kernels)
        split = split_step(kernels, window, compute_part)
        inside = [k for k in kernels if k.start_us >= window[0] and not k.is_comm]
        split["optimizer_kernels"] = (
            sum(k.end_us - k.start_us for k in inside if compute_part(k.path) == "optimizer") / 1e3
        )
        out: dict = {f"{k}_ms": v for k, v in split.items()}
        out["top_kernels"] = top_kernels(inside, compute_part)
        out["version"] = BREAKDOWN_VERSION
        return out
    return _host_split(prof, classify)


def top_kernels(kernels, classify, per_part: int = 3) -> str:
    """What each part is made of: its `per_part` kernels with the most time (summed over their
    launches, ms; names cut to 60 characters), "part: name ms, ...; part: ..."."""
    by: dict[str, dict[str, float]] = {}
    for k in kernels:
        part = by.setdefault(classify(k.path), {})
        part[k.name[:60]] = part.get(k.name[:60], 0.0) + (k.end_us - k.start_us) / 1e3
    return "; ".join(
        f"{part}: "
        + ", ".join(f"{n} {ms:.0f}" for n, ms in sorted(d.items(), key=lambda x: -x[1])[:per_part])
        for part, d in sorted(by.items())
    )


def _host_split(prof, classify) -> dict[str, float]:
    """CPU: the step's host time split by part over the main thread's operators (each one's
    self time, by the path of operators around it), the rest `host` (Python, waits)."""
    events = list(prof.events())
    ranges = [e for e in events if e.name == STEP_RANGE]
    if not ranges:
        raise ValueError(f"no {STEP_RANGE!r} range in the profile")
    r = ranges[-1]
    main = r.thread
    parts: dict[str, float] = {}
    for e in events:
        if e.thread != main or e.is_async or e.name == STEP_RANGE:
            continue
        if not (r.time_range.start <= e.time_range.start < r.time_range.end):
            continue
        if e.self_cpu_time_total <= 0 or not e.name.startswith(("aten::", "c10d::")):
            continue
        chain, p = [], e
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        part = classify(" / ".join(reversed(chain)))
        parts[part] = parts.get(part, 0.0) + e.self_cpu_time_total / 1e3
    window = (r.time_range.end - r.time_range.start) / 1e3
    out = {f"{k}_ms": v for k, v in parts.items()}
    out.update(host_ms=max(0.0, window - sum(parts.values())), window_ms=window)
    return out


def build(variant: str, dims: dict, layers: int, args, ctx, changes: dict | None = None):
    """(step, engine or None) of one variant on this rank's part of the batch; `changes`: the
    engine's options an ablation row turns off."""
    import torch
    import torch.nn.functional as F

    from cs336_systems.core.device import autocast
    from cs336_systems.engine.step import Engine, EngineOptions
    from cs336_systems.model import TransformerLM

    k: LeaderboardKnobs = args.block
    torch.manual_seed(SEED)
    with ctx.device:
        lm = TransformerLM(
            vocab_size=dims["vocab"],
            context_length=dims["context_length"],
            d_model=dims["d_model"],
            num_layers=layers,
            num_heads=dims["num_heads"],
            d_ff=dims["d_ff"],
        )
    per_rank = dims["batch"] // ctx.world_size
    gen = torch.Generator(device=ctx.device).manual_seed(SEED + ctx.rank)
    shape = (per_rank, dims["context_length"])
    tokens = torch.randint(0, dims["vocab"], shape, device=ctx.device, generator=gen)
    targets = torch.randint(0, dims["vocab"], shape, device=ctx.device, generator=gen)
    if variant == "engine":
        opts = {"precision": "bf16", "checkpoint": k.checkpoint, "compile": k.compile}
        opts.update(changes or {})
        engine = Engine.build(lm, tokens, targets, EngineOptions(**opts))
        return engine.step, engine
    net = lm
    if ctx.world_size > 1:
        from cs336_systems.parallel.ddp import wrap

        net = wrap(lm, "overlap")
    opt = torch.optim.AdamW(
        lm.parameters(), lr=1e-4, weight_decay=0.01, fused=ctx.device.type == "cuda"
    )

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast("bf16", ctx.device):
            logits = net(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        if hasattr(net, "finish_gradient_synchronization"):
            net.finish_gradient_synchronization()
        opt.step()

    return step, None


def memory_check(
    variant: str,
    dims: dict,
    layers: int,
    ctx,
    world: int,
    changes: dict | None = None,
    measured_fit: bool = False,
) -> tuple[str | None, dict]:
    """The memory model's verdict before anything is allocated: (a `skipped:` status or None,
    {need_gb, free_gb}) in GB of 10^9 bytes; an ablation's `changes` that the model sees (whole
    blocks only, a fixed checkpointing, the plain loss's b n V logits) are counted. With
    `measured_fit` the fixed checkpointing is one a run of this configuration fitted (the
    engine's own choice, from its measured block bytes): only what `changes` add is checked."""
    from cs336_systems.core.device import free_memory_mib
    from cs336_systems.engine import memory_model
    from cs336_systems.engine.fused_ce import chunk_for

    s = memory_model.StepShape(
        vocab_size=dims["vocab"],
        d_model=dims["d_model"],
        d_ff=dims["d_ff"],
        num_layers=layers,
        num_heads=dims["num_heads"],
        batch=dims["batch"] // world,
        seq=dims["context_length"],
        precision="bf16",
        attention="flash_triton" if ctx.device.type == "cuda" else "sdpa",
        device_type=ctx.device.type,
        world=world,
        scheme="single" if world == 1 else "fsdp",
    )
    free = (free_memory_mib(ctx.device) or math.inf) * 2**20
    changes = changes or {}
    if variant == "engine":
        chunk = chunk_for(s.vocab_size)
        if changes.get("checkpoint", "auto") != "auto":
            fixed = memory_model.step_bytes(s, changes["checkpoint"], chunk)
            choice = {**fixed, "fits": True, "budget": free * (1 - memory_model.MARGIN)}
            choice["fits"] = measured_fit or fixed["total"] <= choice["budget"]
        else:
            choice = memory_model.choose_checkpointing(
                s, free, chunk, changes.get("selective", True)
            )
        if changes.get("loss") == "plain":  # the logits in bf16, their fp32 copy and softmax
            logits = 10 * s.batch * s.seq * s.vocab_size
            choice = {**choice, "total": choice["total"] + logits}
            choice["fits"] = choice["total"] <= choice["budget"]
        reason = memory_model.shortfall(choice, world)
    else:
        choice = memory_model.plain_bytes(s)
        fits = choice["total"] <= free * (1 - memory_model.MARGIN)
        reason = None if fits else memory_model.need_message(choice["total"], free, "plain model")
    return reason, {"need_gb": choice["total"] / 1e9, "free_gb": free / 1e9}


def reduced_layers(dims: dict, ctx, cap: int = 0) -> int:
    """The most layers (at most the configured, and at most `cap` when it is > 0) whose engine
    step fits here; 0 if none."""
    top = min(dims["num_layers"], cap) if cap > 0 else dims["num_layers"]
    for layers in range(top, 0, -1):
        if memory_check("engine", dims, layers, ctx, 1)[0] is None:
            return layers
    return 0


def measure(variant: str, dims: dict, layers: int, args, ctx, changes=None, profile=True) -> dict:
    import torch

    from cs336_systems.core.costs import train_step_flops
    from cs336_systems.core.harness import Stopwatch, summarize, time_steps
    from cs336_systems.engine.leaderboard_rules import benchmark_seconds, fits_budget
    from cs336_systems.parallel.launch import every_rank, slowest_rank

    k: LeaderboardKnobs = args.block
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    with Stopwatch() as setup:
        step, engine = build(variant, dims, layers, args, ctx, changes)
        warm, _ = time_steps(step, k.warmup_steps, 1, ctx.device)  # the first steps: compile
    _, times = time_steps(step, 0, k.measure_steps, ctx.device)
    times = slowest_rank(times, ctx)
    setup_s = slowest_rank([setup.s], ctx)[0]
    stats = summarize(times, "step")  # the true median: of the two middle steps for an even count
    ms = stats["step_ms_median"]
    flops = train_step_flops(
        dims["vocab"], dims["d_model"], layers, dims["d_ff"], dims["batch"], dims["context_length"]
    )
    peak = (
        torch.cuda.max_memory_allocated(ctx.device) / 2**30
        if ctx.device.type == "cuda"
        else math.nan
    )
    row = {
        "checkpointing": engine.plan["strategy"] if engine is not None else "none",
        "matmul_path": matmul_path(variant, ctx.device.type, ctx.world_size),
        **stats,
        "tokens_per_s": dims["batch"] * dims["context_length"] / (ms / 1e3),
        "step_pflop": flops / 1e15,
        "tflops": flops / (ms / 1e3) / 1e12,
        "setup_s": setup_s,
        "benchmark_s": benchmark_seconds(setup_s, ms),
        "fits_10_min": fits_budget(setup_s, ms),
        "peak_mem_gib_per_rank": slowest_rank([peak], ctx)[0],
    }
    if engine is not None:
        o = engine.options
        chosen = engine.plan["attention"]
        row.update(
            attention=chosen["chosen"],
            attention_asked=o.attention,
            **{f"attention_{k}_ms": v for k, v in chosen["ms"].items()},
            attention_notes="; ".join(chosen["notes"]),
            loss=o.loss,
            fsdp_units=o.fsdp_units if ctx.world_size > 1 else "",
            prefetch=o.prefetch,
            compiled=o.compile,
            fsdp_window=getattr(engine.net, "window", math.nan),
        )
        for key, value in (engine.calibration or {}).items():
            row[f"calibration_{key}"] = value
        # fused AdamW over this rank's fp32 parameters: read p, g, m, v; write p, m, v
        local = sum(p.numel() for p in engine.optimizer.param_groups[0]["params"])
        local += sum(p.numel() for g in engine.optimizer.param_groups[1:] for p in g["params"])
        row["optimizer_bytes_per_rank"] = 28.0 * slowest_rank([local], ctx)[0]
    if profile and k.profile:
        ranks = every_rank(_profile(step, ctx.device), ctx)
        for k, v in ranks[0].items():
            row[f"breakdown_{k}"] = v
        for r, parts in enumerate(ranks):
            for k, v in parts.items():
                row[f"breakdown_r{r}_{k}"] = v
    return row


def points_of(k: LeaderboardKnobs, config: str) -> list[tuple[str, str]]:
    """(variant, ablation) of each row configuration `config` runs."""
    if config == "ablation":
        return [("engine", name) for name in k.ablations]
    return [(v, "") for v in k.variants]


def worker(args) -> None:
    from cs336_systems.core.harness import release_memory, run_point
    from cs336_systems.parallel.launch import finalize_worker, init_worker, write_rows

    k: LeaderboardKnobs = args.block
    ctx = init_worker(k.backend, timeout_s=k.timeout_s)
    dims = {dim: getattr(k, dim) for dim in DIMS}
    layers = dims["num_layers"]
    if args.config == "reduced":
        layers = reduced_layers(dims, ctx, k.reduced_layers)
    rows: list[dict] = []
    for variant, ablation in points_of(k, args.config):
        changes = ABLATIONS.get(ablation, {})
        row = {"config": args.config, "variant": variant, "ablation": ablation}
        pinned = args.config == "ablation" and pins_checkpointing(ablation, args.pinned)
        if pinned:  # one change per row: the engine's own checkpointing, not a new choice
            changes = {**changes, "checkpoint": args.pinned}
        row["checkpoint_pinned"] = args.pinned if pinned else ""
        row["num_layers"] = layers
        with point(args.config, variant, ablation or "-", f"{layers} layers"):
            reason, need = memory_check(
                variant, dims, layers, ctx, ctx.world_size, changes, measured_fit=pinned
            )
            row.update(need)
            if layers == 0:
                reason = "skipped: not one layer fits by the memory model"
            if reason is not None:
                row["status"] = reason
            else:
                profile = args.config != "ablation"  # the ablation rows time steps only
                res = run_point(
                    lambda v=variant, c=changes, p=profile: measure(
                        v, dims, layers, args, ctx, c, p
                    )
                )
                row.update({"status": res.status, **(res.value or {})})
            release_memory()
            log.log(
                status_level(row["status"]),
                "%s %s",
                row["status"],
                f"{row.get('step_ms_median', math.nan):.1f} ms",
            )
        rows.append(row)
        write_rows(rows, args.result, ctx)
    finalize_worker()


def _run_config(args, config: str, world: int, argv: list[str] | None) -> list[dict]:
    """The rows of one configuration on `world` ranks: its launch's, or `skipped` rows with the
    command that runs them."""
    from cs336_systems.parallel.launch import (
        Topology,
        feasibility,
        fill_missing,
        launch,
        stage_command,
    )

    k: LeaderboardKnobs = args.block
    planned = [{"config": config, "variant": v, "ablation": a} for v, a in points_of(k, config)]
    # one process needs no peer: feasibility's two-GPU floor is for collectives
    reason = feasibility(k.backend, world) if world > 1 else None
    if reason is None:
        result = launch(
            "cs336_systems.stages.leaderboard.measure",
            worker_argv(args, [f"--config={config}", f"--pinned={args.pinned}"]),
            Topology(world),
            timeout_s=k.timeout_s,
            extra_env=k.env,
        )
        failure = result.status if result.status != "ok" else "error: no result from workers"
        for r in result.rows:
            r.setdefault("ablation", "")
        got = fill_missing(planned, result.rows, ("config", "variant", "ablation"), failure)
    else:
        got = [{**p, "status": reason} for p in planned]
        log.warning("%s; the command that runs it: %s", reason, stage_command("leaderboard", argv))
    for row in got:
        row.update(
            {
                "world_size": world,
                "backend": k.backend,
                "command": stage_command("leaderboard", argv),
            }
        )
        for dim in DIMS:
            row.setdefault(dim, getattr(k, dim))
    return got


def run(args, argv: list[str] | None = None) -> list[dict]:
    import pandas as pd

    from cs336_systems.core.device import gpu_count
    from cs336_systems.parallel.launch import feasibility

    k: LeaderboardKnobs = args.block
    plans = []
    if "full" in args.plans:
        plans.append(("full", k.world_size))
    short = feasibility(k.backend, k.world_size) is not None
    if "reduced" in args.plans and short and k.backend == "nccl" and gpu_count() >= 1:
        plans.append(("reduced", 1))
    if "ablation" in args.plans and k.ablations:
        plans.append(("ablation", k.world_size))
    rows = [row for config, world in plans for row in _run_config(args, config, world, argv)]
    # MFU's denominator: every rank's GPU at the measured peak of the variant's matmul path
    return with_path_mfu(pd.DataFrame(rows), args.peak_csv).to_dict("records")


def _names_of(known) -> callable:
    def parse(text: str) -> list[str]:
        names = [x for x in text.split(",") if x.strip()]
        if bad := sorted(set(names) - set(known)):
            raise argparse.ArgumentTypeError(f"unknown name(s) {bad}; known: {tuple(known)}")
        return names

    return parse


def _own_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--plans",
        type=_names_of(PLANS),
        help="which configurations: full, reduced (one GPU, when full cannot run), ablation",
    )
    ap.add_argument(
        "--checkpoint-from",
        help="the stage's runs CSV: the ablation rows run its engine row's checkpointing",
    )
    ap.add_argument("--peak-csv", help="the ceilings stage's CSV (bf16 peak)")
    ap.add_argument("--config", choices=PLANS, help=argparse.SUPPRESS)
    ap.add_argument("--pinned", help=argparse.SUPPRESS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (which configurations the job runs, the files it reads, where
    its rows go and what they say they come from) and the stage's knobs as one value
    (`--block`: its preset block, `LeaderboardKnobs`)."""
    doc = __doc__.splitlines()[0]
    args = parse_stage_args(LeaderboardKnobs, argv, doc, _own_arguments, ("out", "plans"))
    if not args.worker:
        args.pinned = ""
        if "ablation" in args.plans:
            args.pinned = engine_checkpointing(args.checkpoint_from)
            if args.checkpoint_from and not args.pinned:
                log.warning(
                    "no engine row ran in %s: each ablation row chooses its own checkpointing",
                    args.checkpoint_from,
                )
    return args


COLUMNS_FIRST = ["backend", "world_size", "config", "variant", "ablation", "num_layers", "status"]


def main(argv: list[str] | None = None) -> None:
    from cs336_systems.parallel.launch import stage_main

    args = parse_args(argv)
    stage_main("leaderboard", args, worker, lambda: run(args, argv), COLUMNS_FIRST)


if __name__ == "__main__":
    main()
