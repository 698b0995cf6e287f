"""The benchmark stage's knobs (`BenchmarkKnobs`, one per preset block of
config/stages/benchmark.yaml), what the workflow needs to plan the stage's jobs from a block,
and the time budget's estimate of each job (`estimate`, `ETA_KEYS`).

Pure functions of the typed preset block (standard library only): the rules file calls them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

Mode = Literal["forward", "forward_backward", "train_step"]
Precision = Literal["fp32", "bf16"]
Attention = Literal["naive", "sdpa", "flash_triton"]
# a model size name: checked against the run's size table (`check` below)
SIZES = {"minItems": 1, "uniqueItems": True}
CONTEXTS = {"minItems": 1, "uniqueItems": True, "items": {"minimum": 1}}
SET = {"minItems": 1, "uniqueItems": True}


@dataclass(frozen=True)
class CompileOnly(Knobs):
    """Where compiled points run: only where every listed axis matches."""

    sizes: list[str] | None = knob("model sizes", default=None, **SIZES)
    context_lengths: list[int] | None = knob("context lengths", default=None, **CONTEXTS)
    attentions: list[Attention] | None = knob("attentions", default=None, **SET)
    modes: list[Mode] | None = knob("modes", default=None, **SET)
    precisions: list[Precision] | None = knob("precisions", default=None, **SET)


@dataclass(frozen=True)
class AttentionOnly(Knobs):
    """Where attentions after the first run (the first runs everywhere)."""

    sizes: list[str] | None = knob("model sizes", default=None, **SIZES)
    context_lengths: list[int] | None = knob("context lengths", default=None, **CONTEXTS)


@dataclass(frozen=True)
class WarmupSweep(Knobs):
    """One point measured after each number of warm-up steps, in a fresh process each time."""

    sizes: list[str] = knob("model sizes, one job each", **SIZES)
    context_length: int = knob("tokens per sequence", minimum=1)
    warmups: list[int] = knob("warm-up steps before the measured ones", **SET, items={"minimum": 0})
    measure_steps: int = knob("steps measured", minimum=1)
    mode: Mode = knob("what a step runs")
    precision: Precision = knob("fp32, or bf16 autocast")
    fresh_process: bool = knob(
        "each warm-up count in a process of its own (false: all of them in the job's process, "
        "one after another, later counts inheriting what earlier ones warmed)",
        default=True,
    )


@dataclass(frozen=True)
class BenchmarkKnobs(Knobs):
    """End-to-end model latency over size x context x mode x precision x compile, one job per
    (size, context length, attention), and the warm-up sweep."""

    sizes: list[str] = knob("model size names (checked against the edition's table)", **SIZES)
    context_lengths: list[int] = knob("tokens per sequence", **CONTEXTS)
    modes: list[Mode] = knob("what a step runs", **SET)
    precisions: list[Precision] = knob("fp32, or bf16 autocast", **SET)
    compile: list[Literal["eager", "compiled"]] = knob("eager, torch.compile'd", **SET)
    attentions: list[Attention] = knob("the model's attention (the first runs everywhere)", **SET)
    batch_size: int = knob("sequences per step", minimum=1)
    warmup_steps: int = knob("steps before the measured ones", minimum=0)
    measure_steps: int = knob("steps measured", minimum=1)
    compile_only: CompileOnly | None = knob("where compiled points run", default=None)
    compile_mode: (
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None
    ) = knob("torch.compile's mode for compiled points", default=None)
    engines: list[Literal["plain", "fast", "hf_gpt2"]] | None = knob(
        "the train step through the plain model, the engine, a compiled HF GPT-2",
        default=None,
        **SET,
    )
    attention_only: AttentionOnly | None = knob(
        "where attentions after the first run (the first runs everywhere)", default=None
    )
    max_point_s: float | None = knob(
        "a point whose estimated time (its FLOPs over warm-up and measured steps at this"
        " machine's measured matmul rate for its precision, from the ceilings stage) is above"
        " this many seconds becomes a `skipped:` row instead of running",
        default=None,
        exclusiveMinimum=0,
    )
    warmup_sweep: WarmupSweep | None = knob("the warm-up sweep's jobs", default=None)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = BenchmarkKnobs
# what each job reads: a point's job every knob its points share (the job's compile list and
# engines come from `compile_arg` and `engines_arg`); the warm-up sweep's its sweep and batch.
# A value only other jobs read (another size or context, the sweep) leaves a job as it was.
RUN_KNOBS = BenchmarkKnobs.part(
    "modes", "precisions", "compile_only", "compile_mode", "batch_size", "warmup_steps",
    "measure_steps", "max_point_s",
)  # fmt: skip
WARMUP_KNOBS = BenchmarkKnobs.part("batch_size", "warmup_sweep")

# the sweep axes a filter (`compile_only`, `attention_only`) may narrow
FILTERED = {
    "compile_only": ("sizes", "context_lengths", "attentions", "modes", "precisions"),
    "attention_only": ("sizes", "context_lengths"),
}


def _only(only: Knobs | None, axis: str, default: list) -> list:
    """A filter's values on `axis`, or `default` where the filter or its axis is not given."""
    values = getattr(only, axis) if only is not None else None
    return default if values is None else values


def points(k: BenchmarkKnobs) -> list[dict]:
    """One dict per job (size, context_length, attention); attentions other than the first run
    only where `attention_only` (if given) admits the size and context."""
    sizes = set(_only(k.attention_only, "sizes", k.sizes))
    contexts = set(_only(k.attention_only, "context_lengths", k.context_lengths))
    first = k.attentions[0]
    return [
        {"size": s, "context_length": c, "attention": a}
        for s, c, a in itertools.product(k.sizes, k.context_lengths, k.attentions)
        if a == first or (s in sizes and c in contexts)
    ]


def compile_arg(
    k: BenchmarkKnobs, size: str, context_length: int, attention: str | None = None
) -> str:
    """The job's `--compile` list: eager everywhere, compiled where `compile_only` admits its
    size, context length and attention (each torch.compile of a model costs about a minute)."""
    only = k.compile_only
    admitted = (
        size in _only(only, "sizes", [size])
        and context_length in _only(only, "context_lengths", [context_length])
        and (attention is None or attention in _only(only, "attentions", [attention]))
    )
    return ",".join(c for c in k.compile if c == "eager" or admitted)


def compiled(k: BenchmarkKnobs, axis: str) -> list:
    """Within a job, the modes (or precisions: `axis`) that get compiled points."""
    return list(_only(k.compile_only, axis, getattr(k, axis)))


def run_block(k: BenchmarkKnobs) -> dict:
    """The part of the block a point's job reads (`RUN_KNOBS`), its compile filter as the modes
    and precisions that get compiled points (the sizes, contexts and attentions it admits are
    the job's `compile_arg`)."""
    part = RUN_KNOBS.select(k)
    part["compile_only"] = {axis: compiled(k, axis) for axis in ("modes", "precisions")}
    return part


def engines_arg(k: BenchmarkKnobs, attention: str) -> str:
    """The engines a job runs beside the plain grid: in the first attention's job only (the
    engine picks its own attention), `plain` elsewhere."""
    engines = k.engines or ["plain"]
    return ",".join(engines) if attention == k.attentions[0] else "plain"


def engine_points(engine: str, precisions, compiles) -> list[tuple[str, str]]:
    """(precision, compile) of the engine's rows in a job: the engine is a bf16 engine (fp32
    master weights, bf16 autocast compute), so bf16 where the job runs it; compiled where the
    job's compile filter admits it. The HuggingFace peer: compiled bf16 only, as the peer is
    published, and only where the job compiles."""
    if engine == "hf_gpt2":
        return [("bf16", "compiled")] if "compiled" in compiles else []
    precs = ["bf16"] if "bf16" in precisions else list(precisions)
    return [(p, c) for p in precs for c in compiles]


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {
    "benchmark": lambda w: f"{w['size']} ctx{w['ctx']} {w['attention']}",
    "benchmark_warmup": lambda w: f"warm-up sweep {w['size']}",
}


def _grid_s(k: BenchmarkKnobs, cost: Costs, p: dict, compiles: list[str]) -> tuple[float, set]:
    """A point job's plain grid: its steps' seconds and the compiled graphs it builds (points
    the memory model refuses, or above max_point_s, cost nothing: `skipped` rows decided before
    allocating; a compiled graph about a minute per model shape and precision)."""
    size, ctx, batch = p["size"], p["context_length"], k.batch_size
    steps = k.warmup_steps + k.measure_steps
    c_modes, c_precs = compiled(k, "modes"), compiled(k, "precisions")
    run, graphs = 0.0, set()
    for comp, prec, mode in itertools.product(compiles, k.precisions, k.modes):
        if comp == "compiled" and (mode not in c_modes or prec not in c_precs):
            continue
        if not cost.fits(cost.step_gib(size, ctx, batch, mode, prec)):
            continue  # a `skipped: ... needs` row
        if cost.too_costly(size, ctx, batch, mode, prec, steps, k.max_point_s):
            continue  # a `skipped:` row
        run += steps * cost.step_s(size, ctx, batch, mode, prec)
        if comp == "compiled":
            graphs.add(prec)
    return run, graphs


def _engines_s(k: BenchmarkKnobs, cost: Costs, p: dict, compiles, graphs: set) -> tuple:
    """The job's engine rows (the first attention's job): (rows, steps' seconds, setup); each
    engine builds its own model; a compiled engine other than `fast` one more graph (`graphs`,
    in place); none where the fp32 state (16 B a parameter) does not fit."""
    size, ctx, batch = p["size"], p["context_length"], k.batch_size
    steps = k.warmup_steps + k.measure_steps
    n, run, setup = 0, 0.0, 0.0
    if not cost.fits(16 * cost.params(size) / 2**30):
        return n, run, setup
    for engine in [e for e in engines_arg(k, p["attention"]).split(",") if e != "plain"]:
        for prec, comp in engine_points(engine, k.precisions, compiles):
            if cost.too_costly(size, ctx, batch, "train_step", prec, steps, k.max_point_s):
                continue
            n += 1
            run += steps * cost.step_s(size, ctx, batch, "train_step", prec)
            setup += cost.build_s(size) + cost.dev.engine_s
            # the engine compiles per block from the run's cache (its compiled row costs what
            # its eager one does); the HF peer compiles a whole model
            if comp == "compiled" and engine != "fast":
                graphs.add(f"{engine} {prec}")
    return n, run, setup


def _point_job(k: BenchmarkKnobs, cost: Costs, p: dict) -> Job:
    size = p["size"]
    compiles = compile_arg(k, size, p["context_length"], p["attention"]).split(",")
    run, graphs = _grid_s(k, cost, p, compiles)
    n_eng, eng_run, setup = _engines_s(k, cost, p, compiles, graphs)
    run += eng_run
    setup += len(graphs) * cost.compile_s(size)
    build = cost.build_s(size) if run else 0.0
    if run and "train_step" in k.modes:
        build += cost.dev.first_train_step_s
    if run and p["attention"] == "flash_triton":
        setup += cost.dev.triton_model_s
    how = f"{len(graphs)} compiled graphs, {n_eng} engine rows, {run:.0f} s of steps"
    how = how if run else "every point skipped before allocating"
    total = cost.dev.job_start_s + build + setup + run
    return Job("benchmark", f"{size} ctx{p['context_length']} {p['attention']}", total, how)


def estimate(k: BenchmarkKnobs, cost: Costs) -> list[Job]:
    """One job per point: its plain grid, a compile per compiled precision, and in the first
    attention's job the engines; then one job per size of the warm-up sweep (a fresh process
    per warm-up count)."""
    jobs = [_point_job(k, cost, p) for p in points(k)]
    w = k.warmup_sweep
    for size in w.sizes if w is not None else []:
        n = sum(x + w.measure_steps for x in w.warmups)
        t = n * cost.step_s(size, w.context_length, k.batch_size, w.mode, w.precision)
        # a process of its own per count (measure.py: fresh_process_rows): its start, its
        # model and, for a train step, its first step's one-time costs, each time
        starts = len(w.warmups) if w.fresh_process else 0
        build = cost.build_s(size, len(w.warmups)) + starts * cost.dev.job_start_s
        first = cost.dev.first_train_step_s if w.mode == "train_step" else 0.0
        build += max(1, starts) * first
        how = f"{starts} fresh processes, {n} steps" if starts else f"one process, {n} steps"
        jobs.append(
            Job("benchmark", f"warm-up sweep {size}", cost.dev.job_start_s + build + t, how)
        )
    return jobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """What the schema cannot say: size names of this run's model table, and filters that name
    only values of the sweep."""
    at.sizes("sizes", cfg["sizes"], facts)
    at.sizes(("warmup_sweep", "sizes"), cfg.get("warmup_sweep", {}).get("sizes", []), facts)
    # a filter that selects nothing here is inert (no compiled points, one attention): the
    # defaults' filters survive a user's override of the sweep (mappings merge key by key)
    active = {
        "compile_only": "compiled" in cfg["compile"],
        "attention_only": len(cfg["attentions"]) > 1,
    }
    for name, axes in FILTERED.items():
        for axis in axes:
            if active[name] and axis in cfg.get(name, {}):
                at.within((name, axis), cfg[name][axis], cfg[axis], axis)
