"""The memory stage's knobs (`MemoryKnobs`, one per preset block of config/stages/memory.yaml)
and what the workflow checks in a block beyond its schema (no torch)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.edition import size_table
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

# inference: a forward under torch.inference_mode() (no graph, nothing saved); forward: the same
# forward with autograd on (what a training step's forward holds); the rest as the benchmark's
Mode = Literal["inference", "forward", "forward_backward", "train_step"]


@dataclass(frozen=True)
class MemoryCheckpoint(Knobs):
    """Points run again with one level of activation checkpointing."""

    contexts: list[int] = knob(
        "the contexts run again checkpointed", uniqueItems=True, items={"minimum": 1}
    )
    modes: list[Mode] = knob("the modes run again checkpointed", uniqueItems=True)
    strategy: str = knob(
        "best (the analytic best every_<k>) or a core/checkpoint_plans.py strategy",
        pattern="^(best|every_[0-9]+|sqrt|halving|chain)$",
    )


@dataclass(frozen=True)
class MemoryKnobs(Knobs):
    """CUDA memory snapshots of one step, peak memory with a breakdown and the analytic activation
    model, one job per model size."""

    sizes: list[str] = knob(
        "model size names (checked against the edition's table), one job each",
        minItems=1,
        uniqueItems=True,
    )
    context_lengths: list[int] = knob(
        "tokens per sequence of the points", minItems=1, uniqueItems=True, items={"minimum": 1}
    )
    modes: list[Mode] = knob(
        "what a measured step runs: inference (a forward under torch.inference_mode), forward "
        "(autograd on), forward_backward, train_step",
        minItems=1,
        uniqueItems=True,
    )
    precisions: list[Literal["fp32", "bf16"]] = knob(
        "fp32, or bf16 autocast", minItems=1, uniqueItems=True
    )
    batch_size: int = knob("sequences per step", minimum=1)
    warmup_steps: int = knob("steps run before the measured one", minimum=0)
    max_entries: int | None = knob(
        "allocator events kept in a snapshot's trace", default=None, minimum=1
    )
    checkpoint: MemoryCheckpoint | None = knob(
        "points run again with one level of checkpointing", default=None
    )
    skip_factor: float | None = knob(
        "a point predicted to need more than this many times the GPU's memory is skipped",
        default=None,
        exclusiveMinimum=0,
    )
    nsys_contexts: list[int] | None = knob(
        "contexts of part (f)'s Nsight --cuda-memory-usage capture of one block",
        default=None,
        uniqueItems=True,
        items={"minimum": 1},
    )
    nsys: str | None = knob("path to the nsys binary; empty for $NSYS, then PATH", default=None)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = MemoryKnobs
# what one job (one size) reads: every knob but the sweep's sizes (a size added to the sweep
# leaves the other sizes' jobs as they were)
JOB_KNOBS = MemoryKnobs.part(*(f.name for f in fields(MemoryKnobs) if f.name != "sizes"))


def layer_counts(edition: int) -> dict[str, int]:
    """Layers per size name of the edition's table (read from model.py's source, no torch)."""
    return {name: spec["num_layers"] for name, spec in size_table(edition).items()}


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"memory": lambda w: w["size"]}


def _step_gib(cost: Costs, size: str, ctx: int, batch: int, mode: str, prec: str) -> float:
    """A point's memory (GiB); an inference forward: the weights (a quarter of a training
    step's 16 bytes a parameter) and about one layer's activations, freed as it goes."""
    if mode != "inference":
        return cost.step_gib(size, ctx, batch, mode, prec)
    state, acts = cost.state_and_activations_gib(size, ctx, batch, prec)
    return state / 4 + acts / cost.layers(size)


def _size_s(k: MemoryKnobs, cost: Costs, size: str) -> tuple[float, int, int]:
    """(steps' seconds, points run, points skipped) of one size's job: every (context, mode,
    precision) point without checkpointing (those above skip_factor x the device's memory
    skipped before allocating), the checkpointed ones at checkpoint.contexts (recomputation:
    4/3 of a training step), and part (f): one block's forward+backward per precision."""
    batch = k.batch_size
    factor = k.skip_factor if k.skip_factor is not None else 1.5
    ck = k.checkpoint
    run, points, skipped = 0.0, 0, 0
    for ctx in k.context_lengths:
        for named in k.modes:
            mode = "forward" if named == "inference" else named  # the cost model's modes
            for prec in k.precisions:
                step = (k.warmup_steps + 1) * cost.step_s(size, ctx, batch, mode, prec)
                if cost.fits(_step_gib(cost, size, ctx, batch, named, prec), factor):
                    points, run = points + 1, run + step
                else:
                    skipped += 1
                if ck is not None and ctx in ck.contexts and named in ck.modes:
                    points += 1
                    run += step * (4 / 3 if mode != "forward" else 1.0)
        for prec in k.precisions:  # part (f)
            fb = cost.step_s(size, ctx, batch, "forward_backward", prec)
            run += 2 * fb / cost.layers(size)
    return run, points, skipped


def estimate(k: MemoryKnobs, cost: Costs) -> list[Job]:
    """One job per size: its points, a snapshot each, and an Nsight capture per nsys context
    and precision (GPU only: `skipped` rows without CUDA)."""
    jobs = []
    for size in k.sizes:
        run, points, skipped = _size_s(k, cost, size)
        nsys = len(k.nsys_contexts or []) * len(k.precisions) if cost.dev.gpus else 0
        total = cost.dev.job_start_s + cost.build_s(size) + run + points * cost.dev.snapshot_s
        total += nsys * (cost.dev.job_start_s + cost.dev.capture_s)
        how = f"{points} snapshots, {skipped} skipped, {nsys} nsys captures"
        jobs.append(Job("memory", size, total, how))
    return jobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("sizes", cfg["sizes"], facts)
    ck = cfg.get("checkpoint")
    if ck:
        at.within(
            ("checkpoint", "contexts"), ck["contexts"], cfg["context_lengths"], "context_lengths"
        )
        at.within(("checkpoint", "modes"), ck["modes"], cfg["modes"], "modes")
        if "inference" in ck["modes"]:
            at.fail(
                ("checkpoint", "modes"),
                ck["modes"],
                "modes without inference: an inference forward saves nothing to checkpoint",
            )
        m = re.match(r"^every_(\d+)$", ck["strategy"])
        layers = layer_counts(facts.edition)
        for size in cfg["sizes"]:
            n = layers.get(size)
            if m and n and n % int(m.group(1)):
                divisors = ", ".join(str(k) for k in range(1, n + 1) if n % k == 0)
                at.fail(
                    ("checkpoint", "strategy"),
                    ck["strategy"],
                    f"best, or every_<k> with k a divisor of the {n} layers of {size}: {divisors}",
                )
    for i, c in enumerate(cfg.get("nsys_contexts", [])):
        if c not in cfg["context_lengths"]:
            at.fail(
                ("nsys_contexts", i), c, f"a value of context_lengths ({cfg['context_lengths']})"
            )
