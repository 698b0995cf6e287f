"""The benchmark stage's knobs (`BenchmarkKnobs`, one per preset block of
config/stages/benchmark.yaml) and what the workflow needs to plan the stage's jobs from a block.

Pure functions of the validated preset block (no torch): the rules file calls them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
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
    """One point measured after each number of warm-up steps, on a fresh model each time."""

    sizes: list[str] = knob("model sizes, one job each", **SIZES)
    context_length: int = knob("tokens per sequence", minimum=1)
    warmups: list[int] = knob("warm-up steps before the measured ones", **SET, items={"minimum": 0})
    measure_steps: int = knob("steps measured", minimum=1)
    mode: Mode = knob("what a step runs")
    precision: Precision = knob("fp32, or bf16 autocast")


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


def points(cfg: dict) -> list[dict]:
    """One dict per job (size, context_length, attention); attentions other than the first run
    only where `attention_only` (if given) admits the size and context."""
    only = cfg.get("attention_only", {})
    sizes = set(only.get("sizes", cfg["sizes"]))
    contexts = set(only.get("context_lengths", cfg["context_lengths"]))
    first = cfg["attentions"][0]
    return [
        {"size": s, "context_length": c, "attention": a}
        for s, c, a in itertools.product(cfg["sizes"], cfg["context_lengths"], cfg["attentions"])
        if a == first or (s in sizes and c in contexts)
    ]


def compile_arg(cfg: dict, size: str, context_length: int, attention: str | None = None) -> str:
    """The job's `--compile` list: eager everywhere, compiled where `compile_only` admits its
    size, context length and attention (each torch.compile of a model costs about a minute)."""
    only = cfg.get("compile_only", {})
    admitted = (
        size in only.get("sizes", [size])
        and context_length in only.get("context_lengths", [context_length])
        and (attention is None or attention in only.get("attentions", [attention]))
    )
    return ",".join(c for c in cfg["compile"] if c == "eager" or admitted)


def compile_filter(cfg: dict, key: str) -> str:
    """Within a job, the modes (or precisions) that get compiled points."""
    return ",".join(str(v) for v in cfg.get("compile_only", {}).get(key, cfg[key]))


def run_block(cfg: dict) -> dict:
    """The part of the block a point's job reads (`RUN_KNOBS`), its compile filter as the modes
    and precisions that get compiled points (the sizes, contexts and attentions it admits are
    the job's `compile_arg`)."""
    part = RUN_KNOBS.select(cfg)
    part["compile_only"] = {
        key: cfg.get("compile_only", {}).get(key, cfg[key]) for key in ("modes", "precisions")
    }
    return part


def engines_arg(cfg: dict, attention: str) -> str:
    """The engines a job runs beside the plain grid: in the first attention's job only (the
    engine picks its own attention), `plain` elsewhere."""
    engines = cfg.get("engines", ["plain"])
    return ",".join(engines) if attention == cfg["attentions"][0] else "plain"


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
