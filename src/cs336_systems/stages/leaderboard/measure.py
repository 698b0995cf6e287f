"""Stage `leaderboard`: one training step of the 2026 leaderboard model through the engine
(engine/step.py) and through the plain model, on the world size the machine has.

    python -m cs336_systems.stages.leaderboard --backend nccl --world-size 2 --out L.csv

Configurations (`config` column): `full`, the configured model on `--world-size` ranks (a
machine with fewer GPUs writes `skipped` rows with the command that runs it); `reduced`, on one
GPU when the full one cannot run there: the same widths, context and batch with the most layers
the engine fits by the memory model (engine/memory.py). Each (config, variant) is first checked
against the memory model: one that cannot fit is `skipped: needs X GB per rank, have Y` before
anything is allocated. A point that runs: the seconds from an empty process to the end of the
warm-up steps (build, compile, first steps: `setup_s`), the measured steps (slowest rank per
step), tokens/s, TFLOP/s by core/costs.train_step_flops, MFU against the ceilings stage's
measured bf16 peak (`--peak-csv`; NaN without it) times the world size, peak memory per rank
(CUDA allocator; NaN on the CPU), the 10-minute rule (engine/budget.py) and one profiled step's
breakdown (each kernel's device time on a GPU, each operator's self CPU time on the CPU, by
the operator path around it: `timed_paths`).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from cs336_systems.core.edition import add_edition_argument
from cs336_systems.core.log import get_logger, point, status_level
from cs336_systems.parallel.launch import env_pairs

log = get_logger(__name__)
VARIANTS = ("engine", "plain")
DIMS = ("vocab", "d_model", "d_ff", "num_layers", "num_heads", "context_length", "batch")


def peak_tflops(path: str, matmul_path: str = "matmul") -> float:
    """The ceilings stage's measured bf16 TFLOP/s through `matmul_path` (`matmul`: bf16
    weights, a plain bf16 matmul; `autocast_linear`: fp32 weights under bf16 autocast), NaN if
    absent."""
    if not path or not Path(path).exists():
        return math.nan
    from cs336_systems.core.results import read_csv
    from cs336_systems.core.sanity import matmul_peaks

    return matmul_peaks(read_csv(path), matmul_path).get("bf16", math.nan)


def matmul_path(variant: str, device_type: str, world_size: int) -> str:
    """The path a variant's matmuls take: the engine keeps bf16 working weights (a plain bf16
    matmul) where engine/step.py resolve_master_weights turns master weights on by default (bf16
    on one CUDA device; tests/test_leaderboard.py holds the two rules together); else both
    variants run fp32 weights under bf16 autocast."""
    engine_bf16 = variant == "engine" and device_type == "cuda" and world_size == 1
    return "matmul" if engine_bf16 else "autocast_linear"


def with_path_mfu(df, ceilings_csv: str | Path):
    """`df`'s rows with `matmul_path` (inferred for rows written before it was recorded),
    `peak_tflops_per_gpu`, `peak_tflops` (every rank's) and `mfu` against the ceilings' peak of
    that path."""
    if "tflops" not in df or len(df) == 0:
        return df
    df = df.copy()
    given = df["matmul_path"] if "matmul_path" in df else None
    df["matmul_path"] = [
        g if isinstance(g, str) and g else
        matmul_path(v, "cuda" if b == "nccl" else "cpu", int(w))
        for g, v, b, w in zip(
            given if given is not None else [None] * len(df),
            df["variant"], df["backend"], df["world_size"], strict=True,
        )
    ]  # fmt: skip
    peaks = {p: peak_tflops(str(ceilings_csv), p) for p in set(df["matmul_path"])}
    df["peak_tflops_per_gpu"] = df["matmul_path"].map(peaks)
    df["peak_tflops"] = df["peak_tflops_per_gpu"] * df["world_size"]
    df["mfu"] = df["tflops"] / df["peak_tflops"].where(df["peak_tflops"] > 0)
    return df


def _profile(step, device) -> dict[str, float]:
    """One profiled step split into the leaderboard's parts (engine/budget.py: breakdown)."""
    from torch.profiler import ProfilerActivity, profile

    from cs336_systems.core.harness import synchronize
    from cs336_systems.engine.budget import breakdown

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
        synchronize(device)
    return {f"{part}_ms": ms for part, ms in breakdown(timed_paths(prof.events(), device)).items()}


def timed_paths(events, device) -> list[tuple[str, float]]:
    """(where, ms) for every piece of work of a profile, each counted once: on a GPU every
    kernel with its duration, on the CPU every operator with its self time; `where` is the path
    of operators around it, outermost first, then the kernel's name (" / "-joined), so the
    kernels of the fused cross-entropy (generic reductions and elementwise kernels, under the
    `_LinearCrossEntropy` Function and its backward node) count as the loss, and a matmul inside
    it as the loss too (the parts' first matching rule wins). Summing `key_averages()` instead
    counted each kernel twice (its own row and its operator's self device time) and gave the
    loss nothing. Device work the profiler could not tie to an operator (measured on an H100:
    4% of a toy step's kernel time) is one entry of its own, in `other`."""
    out = []
    device_us = 0.0
    for e in events:
        kind = str(e.device_type).rsplit(".", 1)[-1]
        if kind == "CUDA" and device.type == "cuda":
            device_us += e.time_range.elapsed_us()
        if kind != "CPU" or e.is_async:
            continue
        chain, p = [], e
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        where = " / ".join(reversed(chain))
        if device.type == "cuda":
            out += [(f"{where} / {k.name}", k.duration / 1e3) for k in e.kernels]
        elif e.self_cpu_time_total > 0:
            out.append((where, e.self_cpu_time_total / 1e3))
    if device.type == "cuda":
        left = device_us / 1e3 - sum(ms for _, ms in out)
        if left > 1e-3:
            out.append(("(device work without an operator)", left))
    return out


def build(variant: str, dims: dict, layers: int, args, ctx):
    """(step, description) of one variant on this rank's part of the batch."""
    import torch
    import torch.nn.functional as F

    from cs336_systems.core.device import autocast
    from cs336_systems.engine.step import Engine, EngineOptions
    from cs336_systems.model import TransformerLM

    torch.manual_seed(args.seed)
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
    gen = torch.Generator(device=ctx.device).manual_seed(args.seed + ctx.rank)
    shape = (per_rank, dims["context_length"])
    tokens = torch.randint(0, dims["vocab"], shape, device=ctx.device, generator=gen)
    targets = torch.randint(0, dims["vocab"], shape, device=ctx.device, generator=gen)
    if variant == "engine":
        opts = EngineOptions(precision="bf16", checkpoint=args.checkpoint, compile=args.compile)
        engine = Engine.build(lm, tokens, targets, opts)
        return engine.step, engine.plan["strategy"]
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

    return step, "none"


def memory_check(variant: str, dims: dict, layers: int, ctx, world: int) -> tuple[str | None, dict]:
    from cs336_systems.core.device import free_memory_mib
    from cs336_systems.engine import memory
    from cs336_systems.engine.fused_ce import chunk_for

    s = memory.StepShape(
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
    if variant == "engine":
        choice = memory.choose_checkpointing(s, free, chunk_for(s.vocab_size))
        reason = memory.shortfall(choice, world)
    else:
        choice = memory.plain_bytes(s)
        fits = choice["total"] <= free * (1 - memory.MARGIN)
        reason = None if fits else memory.need_message(choice["total"], free, "plain model")
    return reason, {"need_gb": choice["total"] / 1e9, "free_gb": free / 1e9}


def reduced_layers(dims: dict, ctx, cap: int = 0) -> int:
    """The most layers (at most the configured, and at most `cap` when it is > 0) whose engine
    step fits here; 0 if none."""
    top = min(dims["num_layers"], cap) if cap > 0 else dims["num_layers"]
    for layers in range(top, 0, -1):
        if memory_check("engine", dims, layers, ctx, 1)[0] is None:
            return layers
    return 0


def measure(variant: str, dims: dict, layers: int, args, ctx) -> dict:
    import torch

    from cs336_systems.core.costs import train_step_flops
    from cs336_systems.core.harness import Stopwatch, peak_memory_mb, time_steps
    from cs336_systems.engine.budget import benchmark_seconds, fits_budget
    from cs336_systems.parallel.launch import slowest_rank

    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    with Stopwatch() as setup:
        step, strategy = build(variant, dims, layers, args, ctx)
        warm, _ = time_steps(step, args.warmup, 1, ctx.device)  # the first steps: compile
    _, times = time_steps(step, 0, args.steps, ctx.device)
    times = slowest_rank(times, ctx)
    setup_s = slowest_rank([setup.s], ctx)[0]
    ms = sorted(times)[len(times) // 2]
    flops = train_step_flops(
        dims["vocab"], dims["d_model"], layers, dims["d_ff"], dims["batch"], dims["context_length"]
    )
    row = {
        "checkpointing": strategy,
        "matmul_path": matmul_path(variant, ctx.device.type, ctx.world_size),
        "step_ms_median": ms,
        "step_ms_min": min(times),
        "tokens_per_s": dims["batch"] * dims["context_length"] / (ms / 1e3),
        "step_pflop": flops / 1e15,
        "tflops": flops / (ms / 1e3) / 1e12,
        "setup_s": setup_s,
        "benchmark_s": benchmark_seconds(setup_s, ms),
        "fits_10_min": fits_budget(setup_s, ms),
        "peak_mem_gb_per_rank": slowest_rank([peak_memory_mb(ctx.device) / 1e3], ctx)[0]
        if ctx.device.type == "cuda"
        else math.nan,
    }
    if args.profile:
        row.update({f"breakdown_{k}": v for k, v in _profile(step, ctx.device).items()})
    return row


def worker(args) -> None:
    from cs336_systems.core.harness import release_memory, run_point
    from cs336_systems.parallel.launch import finalize_worker, init_worker, write_rows

    ctx = init_worker(args.backend, timeout_s=args.timeout_s)
    dims = {k: getattr(args, k) for k in DIMS}
    layers = dims["num_layers"]
    if args.config == "reduced":
        layers = reduced_layers(dims, ctx, args.reduced_layers)
    rows: list[dict] = []
    for variant in args.variants:
        row = {"config": args.config, "variant": variant, "num_layers": layers}
        with point(args.config, variant, f"{layers} layers"):
            reason, need = memory_check(variant, dims, layers, ctx, ctx.world_size)
            row.update(need)
            if layers == 0:
                reason = "skipped: not one layer fits by the memory model"
            if reason is not None:
                row["status"] = reason
            else:
                res = run_point(lambda v=variant: measure(v, dims, layers, args, ctx))
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


def this_command(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python3", "-m", "cs336_systems.stages.leaderboard", *args])


def worker_argv(args, config: str) -> list[str]:
    out = ["--worker", f"--backend={args.backend}", f"--config={config}"]
    out += [f"--edition={args.edition}"]
    out += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in DIMS]
    out += [
        f"--variants={','.join(args.variants)}",
        f"--warmup={args.warmup}",
        f"--steps={args.steps}",
        f"--checkpoint={args.checkpoint}",
        f"--reduced-layers={args.reduced_layers}",
        f"--timeout-s={args.timeout_s}",
    ]
    out += ["--compile"] if args.compile else []
    out += [] if args.profile else ["--no-profile"]
    return out


def run(args, argv: list[str] | None = None) -> list[dict]:
    from cs336_systems.core.device import gpu_count
    from cs336_systems.parallel.launch import Topology, feasibility, fill_missing, launch

    plans = [("full", args.world_size)]
    if feasibility(args.backend, args.world_size) and args.backend == "nccl" and gpu_count() >= 1:
        plans.append(("reduced", 1))
    rows = []
    for config, world in plans:
        planned = [{"config": config, "variant": v} for v in args.variants]
        # one process needs no peer: feasibility's two-GPU floor is for collectives
        reason = feasibility(args.backend, world) if world > 1 else None
        if reason is None:
            result = launch(
                "cs336_systems.stages.leaderboard.measure",
                worker_argv(args, config),
                Topology(world),
                timeout_s=args.timeout_s,
                extra_env=args.env,
            )
            failure = result.status if result.status != "ok" else "error: no result from workers"
            got = fill_missing(planned, result.rows, ("config", "variant"), failure)
        else:
            got = [{**p, "status": reason} for p in planned]
            log.warning("%s; the command that runs it: %s", reason, this_command(argv))
        for row in got:
            row.update(
                {"world_size": world, "backend": args.backend, "command": this_command(argv)}
            )
            for k in DIMS:
                row.setdefault(k, getattr(args, k))
        rows += got
    import pandas as pd

    # MFU's denominator: every rank's GPU at the measured peak of the variant's matmul path
    return with_path_mfu(pd.DataFrame(rows), args.peak_csv).to_dict("records")


def _names(text: str) -> list[str]:
    names = [x for x in text.split(",") if x.strip()]
    if bad := sorted(set(names) - set(VARIANTS)):
        raise argparse.ArgumentTypeError(f"unknown variant(s) {bad}; known: {VARIANTS}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="local")
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    ap.add_argument("--world-size", type=int, default=2)
    add_edition_argument(ap)
    ap.add_argument("--config", default="full", help=argparse.SUPPRESS)
    for k, v in (
        ("vocab", 151_936),
        ("d_model", 4096),
        ("d_ff", 11_008),
        ("num_layers", 34),
        ("num_heads", 32),
        ("context_length", 32_768),
        ("batch", 2),
    ):
        ap.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    ap.add_argument("--variants", type=_names, default=list(VARIANTS))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--checkpoint", default="auto")
    ap.add_argument(
        "--reduced-layers",
        type=int,
        default=0,
        help="the reduced one-GPU configuration's layers at most (0: the most that fit)",
    )
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--peak-csv", default="", help="the ceilings stage's CSV (bf16 peak)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--env", type=env_pairs, default={}, help="KEY=VAL,... for every worker")
    ap.add_argument("--timeout-s", type=float, default=540.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        ap.error("need --steps >= 1 and --warmup >= 1")
    if args.reduced_layers < 0:
        ap.error(f"need --reduced-layers >= 0, got {args.reduced_layers}")
    if not args.worker and args.out is None:
        ap.error("--out is required")
    return args


COLUMNS_FIRST = ["backend", "world_size", "config", "variant", "num_layers", "status"]


def main(argv: list[str] | None = None) -> None:
    from cs336_systems.parallel.launch import stage_main

    args = parse_args(argv)
    stage_main("leaderboard", args, worker, lambda: run(args, argv), COLUMNS_FIRST)


if __name__ == "__main__":
    main()
