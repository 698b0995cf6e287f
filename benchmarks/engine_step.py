"""One bf16 AdamW training step of the 2026 models (default: the xl at context 512, batch 4),
variant by variant, timed by the project's harness (folds the former
engine_step_bench.py in):

- plain: the benchmark stage's compiled step (core/workload.py: whole model torch.compile'd,
  naive attention, fp32 weights under autocast, fused AdamW);
- engine: engine/step.py with compiled blocks and fp32 weights (master_weights False);
- engine_mw: the same with bf16 working weights and fp32 masters (engine/master_adamw.py);
- hf_gpt2: the benchmark's compiled HuggingFace GPT-2 of the same width and depth
  (stages/benchmark/engines.py; a `skipped` row where transformers is not importable).

Timers (`--timers`): `marks`, synchronized steps with per-phase ms from CUDA events at the
step's marks (core/harness.py:time_marked_steps; the host clock on a CPU); `do_bench`,
steps back to back through harness.device_time (triton's do_bench on a GPU, the
leaderboard's method) and the host's issue time of one step (harness.issue_ms). TFLOP/s by
core/costs.py:train_step_flops (GPT-2's MLP has 2 d d_ff: d_ff x 2/3), MFU against the bf16
peak of each variant's matmul path (bf16 working weights: a plain bf16 matmul; else autocast
F.linear) from a ceilings CSV (`--peak-csv`, or the ceilings stage run here first) read through
core/costs.py:matmul_peaks (the leaderboard's peak_tflops). `--profile`: one profiled step
split into the leaderboard's parts (attention, matmul, loss, optimizer, ...). A point that
fails is a row with its status (harness.run_point); one that the wall budget (`--budget-s`)
leaves no time for by the slowest point so far is a `skipped` row. Writes engine_step.csv
(and ceilings.csv when it measured the peak) in OUT_DIR.

    python3 benchmarks/engine_step.py OUT_DIR                   # xl, every variant, GPU
    python3 benchmarks/engine_step.py OUT_DIR --sizes xl,small --timers marks
    python3 benchmarks/engine_step.py OUT_DIR --smoke   # = --device cpu --sizes tiny
                                                         #   --no-compile --warmup 1 --steps 3
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

import torch

from cs336_systems.core.costs import tflops, train_step_flops
from cs336_systems.core.harness import (
    Stopwatch,
    device_time,
    issue_ms,
    peak_memory_mb,
    release_memory,
    run_point,
    summarize,
    time_marked_steps,
    time_steps,
)
from cs336_systems.core.results import machine_tag, provenance, write_csv
from cs336_systems.core.workload import PHASE_SPANS, Workload
from cs336_systems.engine.step import Engine, EngineOptions
from cs336_systems.model import VOCAB_SIZE, size_spec
from cs336_systems.planning.knobs import block_text
from cs336_systems.planning.log import configure
from cs336_systems.stages.benchmark.engines import hf_step, state_shortfall
from cs336_systems.stages.ceilings.measure import main as ceilings_main
from cs336_systems.stages.leaderboard.measure import _profile
from cs336_systems.stages.leaderboard.mfu import peak_tflops

EDITION = 2026
VARIANTS = ("plain", "engine", "engine_mw", "hf_gpt2")
TIMERS = ("marks", "do_bench")
SPANS = {
    "plain": PHASE_SPANS["train_step"],
    # the engine marks `comm` between backward and the optimizer (nothing to wait for on one rank)
    "engine": {**PHASE_SPANS["train_step"], "opt": ("comm", "optimizer")},
    "hf_gpt2": {},
}
STATS = ("mean", "std", "median")
# a run of every variant in seconds on a CPU (the tiny model, eager, few steps)
SMOKE = {"device": "cpu", "sizes": ["tiny"], "compile": False, "warmup": 1, "steps": 3}


def build(variant: str, size: str, args, device: torch.device):
    """(step(clock=None), spans, what the row says of the variant)."""
    if variant == "hf_gpt2":
        hf = hf_step(size, args.context, args.batch, device, "bf16", args.compile, EDITION)
        return lambda clock=None: hf(), SPANS["hf_gpt2"], {"matmul_path": "autocast_linear"}
    work = Workload.build(size, args.context, args.batch, device, "naive", edition=EDITION)
    if variant == "plain":
        step, _ = work.step("train_step", "bf16", compiled=args.compile)
        info = {"master_weights": False, "checkpointing": "none"}
        return step, SPANS["plain"], {**info, "matmul_path": "autocast_linear"}
    opts = EngineOptions(
        precision="bf16",
        compile=args.compile,
        attention=args.attention,
        checkpoint=args.checkpoint,
        master_weights=variant == "engine_mw",
    )
    engine = Engine.build(work.model, work.tokens, work.targets, opts)

    def step(clock=None):
        if clock is not None:
            clock.mark("start")
        engine.step(phase=clock.mark if clock is not None else None)

    mw = engine.plan["master_weights"]
    info = {"master_weights": mw, "checkpointing": engine.plan["strategy"]}
    return step, SPANS["engine"], {**info, "matmul_path": "matmul" if mw else "autocast_linear"}


def stats(times: dict[str, list[float]], name: str, prefix: str) -> dict[str, float]:
    s = summarize(times[name], prefix)
    return {f"{prefix}_ms_{k}": s[f"{prefix}_ms_{k}"] for k in STATS}


def measure(variant: str, size: str, args, device: torch.device) -> dict:
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with Stopwatch() as built:
        step, spans, row = build(variant, size, args, device)
    if "marks" in args.timers:
        t = time_marked_steps(step, args.warmup, args.steps, device, spans, with_warmup=True)
        warm = t["warmup"]
        row.update(stats(t, "step", "step"))
        for name in spans:
            row.update(stats(t, name, name))
    else:
        warm, last = time_steps(step, args.warmup - 1, 1, device)
        warm += last
    row.update(setup_s=built.s + sum(warm) / 1e3, first_step_ms=warm[0])
    if "do_bench" in args.timers:
        bench = device_time(
            step,
            device,
            "bench_step",
            warmup_ms=args.bench_warmup_ms,
            rep_ms=args.bench_rep_ms,
            warmup_steps=0,
            steps=args.steps,
        )
        row["bench_step_ms_median"] = bench["bench_step_ms_median"]
        row["issue_ms_median"] = issue_ms(step, 5, device)
    row["graph_breaks"] = sum(counters["graph_break"].values()) - breaks
    row["peak_memory_mb"] = peak_memory_mb(device)
    if args.profile:
        row.update({f"breakdown_{k}": v for k, v in _profile(step, device).items()})
    s = size_spec(size, EDITION)
    d_ff = s["d_ff"] * 2 / 3 if variant == "hf_gpt2" else s["d_ff"]  # GPT-2's MLP: 2 d d_ff
    flops = train_step_flops(
        VOCAB_SIZE, s["d_model"], s["num_layers"], d_ff, args.batch, args.context
    )
    peak = peak_tflops(str(args.peak_csv), row["matmul_path"])
    row.update(step_tflop=flops / 1e12, peak_tflops=peak)
    for prefix, name in (("step", ""), ("bench_step", "bench_")):
        if (ms := row.get(f"{prefix}_ms_median")) is not None:
            rate = tflops(flops, ms)
            row[f"{name}tflops"], row[f"{name}mfu"] = rate, rate / peak if peak > 0 else math.nan
    return row


def summary(row: dict) -> str:
    head = f"{row['size']:5s} {row['variant']:9s}"
    if row["status"] != "ok":
        return f"{head} {row['status']}"
    parts = []
    if "step_ms_median" in row:
        phases = " ".join(
            f"{k} {row[f'{k}_ms_median']:.1f}"
            for k in ("fwd", "bwd", "opt")
            if f"{k}_ms_median" in row
        )
        parts.append(
            f"sync {row['step_ms_median']:.1f} ms ({phases or 'no marks'}) MFU {row['mfu']:.1%}"
        )
    if "bench_step_ms_median" in row:
        parts.append(
            f"do_bench {row['bench_step_ms_median']:.1f} ms MFU {row['bench_mfu']:.1%} "
            f"(issue {row['issue_ms_median']:.1f} ms)"
        )
    parts.append(
        f"of {row['peak_tflops']:.3g} TFLOP/s ({row['matmul_path']}); "
        f"peak memory {row['peak_memory_mb'] / 1e3:.1f} GB; setup {row['setup_s']:.0f} s; "
        f"ckpt {row.get('checkpointing', '-')}; breaks {row['graph_breaks']}"
    )
    return f"{head} " + "; ".join(parts)


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        if bad := sorted(set(names) - set(allowed)):
            raise argparse.ArgumentTypeError(f"unknown {bad}; known: {', '.join(allowed)}")
        return names

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for engine_step.csv (and ceilings.csv)")
    ap.add_argument("--smoke", action="store_true", help=f"defaults: {SMOKE}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", type=lambda s: s.split(","), default=["xl"])
    ap.add_argument("--variants", type=_names(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--timers", type=_names(TIMERS), default=list(TIMERS))
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--attention", default="auto", help="the engine's (EngineOptions.attention)")
    ap.add_argument("--checkpoint", default="auto", help="the engine's checkpointing")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (marks; do_bench on CPU)")
    ap.add_argument("--bench-warmup-ms", type=float, default=500)
    ap.add_argument("--bench-rep-ms", type=float, default=2000)
    ap.add_argument("--profile", action="store_true", help="one profiled step's breakdown")
    ap.add_argument("--peak-csv", type=Path, help="a ceilings CSV (default: measured here)")
    ap.add_argument("--matmul-size", type=int, help="the measured peak's n (8192; CPU 256)")
    ap.add_argument("--budget-s", type=float, default=0, help="wall budget (0: none)")
    ap.add_argument("--machine", default=None, help="the machine tag (default: this machine's)")
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        ap.set_defaults(**SMOKE)  # flags given beside it still win
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        ap.error("need --warmup >= 1 and --steps >= 1")
    for size in args.sizes:
        try:
            size_spec(size, EDITION)
        except ValueError as exc:  # an unknown size fails here, before anything runs
            ap.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    start = time.perf_counter()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    machine = args.machine or machine_tag()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.peak_csv is None:
        args.peak_csv = args.out / "ceilings.csv"
        n = args.matmul_size or (8192 if cuda else 256)
        reps = 200 if cuda else 20  # do_bench's ms of repetitions on a GPU; steps on a CPU
        knobs = {"matmul_size": n, "dtypes": ["bf16"], "copy_mb": 64, "reps": reps}
        cargs = ["--preset", "engine_step", "--block", block_text(knobs)]
        cargs += ["--machine", machine, "--out", str(args.peak_csv)]
        ceilings_main(cargs)
    configure("engine_step")
    print(
        f"bf16 peak: {peak_tflops(str(args.peak_csv)):.4g} TFLOP/s (matmul), "
        f"{peak_tflops(str(args.peak_csv), 'autocast_linear'):.4g} (autocast_linear) "
        f"from {args.peak_csv}",
        flush=True,
    )
    base = {
        **provenance(machine, "engine_step", EDITION),
        "context": args.context,
        "batch": args.batch,
        "compile": args.compile,
        "timers": ",".join(args.timers),
    }
    rows, slowest = [], 0.0
    for size in args.sizes:
        for variant in args.variants:
            row = {**base, "size": size, "variant": variant}
            left = args.budget_s - (time.perf_counter() - start)
            if args.budget_s > 0 and left < slowest:
                row["status"] = (
                    f"skipped: {left:.0f} s of the {args.budget_s:.0f} s budget "
                    f"left, the slowest point so far took {slowest:.0f} s"
                )
            elif variant == "hf_gpt2" and importlib.util.find_spec("transformers") is None:
                row["status"] = "skipped: transformers not installed"
            elif why := state_shortfall(size, device, EDITION):
                row["status"] = why
            else:
                with Stopwatch() as took:
                    res = run_point(lambda v=variant, s=size: measure(v, s, args, device))
                    torch._dynamo.reset()  # the compiled graphs hold the last model's memory
                    release_memory()
                slowest = max(slowest, took.s)
                row.update({"status": res.status, **(res.value or {})})
            rows.append(row)
            print(summary(row), flush=True)
            write_csv(rows, args.out / "engine_step.csv")
    print(
        f"wall {time.perf_counter() - start:.0f} s; wrote {args.out / 'engine_step.csv'}; "
        "target: xl engine_mw MFU >= 55% (do_bench)"
    )
    return rows


if __name__ == "__main__":
    main()
