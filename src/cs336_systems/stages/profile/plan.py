"""The profile stage's knobs (`ProfileKnobs`, one per preset block of config/stages/profile.yaml)
and what the workflow checks in a block beyond its schema (no torch)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from cs336_systems.planning.config import Checker, Facts
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

Mode = Literal["forward", "forward_backward", "train_step"]


@dataclass(frozen=True)
class Probe(Knobs):
    """`context_lengths: probe`: the largest context that fits, found by doubling."""

    start: int = knob("the first context tried", minimum=1)
    max: int = knob("the largest context tried", minimum=1)
    mode: Mode = knob("what the probe runs at each context")
    above: int = knob("the grid's contexts exceed this", minimum=0)
    count: int = knob("powers of two in the grid, ending at the largest that fits", minimum=1)


@dataclass(frozen=True)
class Harness(Knobs):
    """The forward timed as the benchmark harness times it, outside the capture, at each
    profiled context (does the profiler's time match it?)."""

    warmup_steps: int = knob("steps before the timed ones", minimum=0)
    measure_steps: int = knob("steps timed; 0: none", minimum=0)


@dataclass(frozen=True)
class ProfileKnobs(Knobs):
    """Which kernels forward, forward+backward and a training step run, per phase, under Nsight
    Systems or torch.profiler, one job per model size."""

    sizes: list[str] = knob(
        "model size names (checked against the edition's table), one job each",
        minItems=1,
        uniqueItems=True,
    )
    context_lengths: list[int] | Literal["probe"] = knob(
        "a list, or `probe` (the largest that fits, found by doubling; see probe)",
        oneOf=[
            {"type": "array", "minItems": 1, "uniqueItems": True,
             "items": {"type": "integer", "minimum": 1}},
            {"type": "string", "const": "probe"},
        ],
    )  # fmt: skip
    modes: list[Mode] = knob("what a profiled step runs", minItems=1, uniqueItems=True)
    precision: Literal["fp32", "bf16"] = knob("fp32, or bf16 autocast")
    batch_size: int = knob("sequences per step", minimum=1)
    warmup_steps: int = knob("steps before the profiled ones", minimum=0)
    measure_steps: int = knob("steps profiled", minimum=1)
    profiler: Literal["auto", "nsys", "torch"] = knob(
        "auto picks nsys with CUDA and a found nsys; a failing nsys falls back"
    )
    probe: Probe | None = knob("how `probe` finds the contexts", default=None)
    harness: Harness | None = knob("the harness's forward beside each point", default=None)
    nsys: str | None = knob("path to the nsys binary; empty for $NSYS, then PATH", default=None)
    timeout_s: int | None = knob("seconds each nsys command may take", default=None, minimum=1)


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = ProfileKnobs
# what one job (one size) reads: every knob but the sweep's sizes (a size added to the sweep
# leaves the other sizes' jobs as they were)
JOB_KNOBS = ProfileKnobs.part(*(f.name for f in fields(ProfileKnobs) if f.name != "sizes"))


def nsys_problem(setting: str) -> str | None:
    """Why `setting` (the config's `nsys`: a path or a name on PATH) is no usable nsys."""
    if not setting:
        return None
    path = Path(setting).expanduser()
    if (path.is_file() and os.access(path, os.X_OK)) or shutil.which(setting):
        return None
    return "an executable nsys (a path, or a name on PATH); empty: $NSYS, then PATH"


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"profile": lambda w: w["size"]}
# a model and one step a tried context (H100, xl: 4 tries in 5 s, the model built on the
# device), the failing one an `oom` row
PROBE_TRY_S = 1.0


def grid_contexts(largest: int | None, above: int, count: int = 3) -> list[int]:
    """The `count` powers of two halving down from `largest`, those above `above`, ascending."""
    if largest is None:
        return []
    out = [largest >> i for i in range(count)]
    return sorted(c for c in out if c > above)


def probe_largest(k: ProfileKnobs, cost: Costs, size: str) -> tuple[int | None, int]:
    """The probe's result assumed from the memory model (the step memory of probe.mode within
    the device's memory; no limit on a CPU): the largest context it reaches doubling from
    probe.start up to probe.max, and how many it tries."""
    pr = k.probe
    largest, tried, ctx = None, 0, pr.start
    while ctx <= pr.max:
        tried += 1
        if not cost.fits(cost.step_gib(size, ctx, k.batch_size, pr.mode, k.precision)):
            break
        largest, ctx = ctx, ctx * 2
    return largest, tried


def _probe_s(k: ProfileKnobs, cost: Costs, size: str) -> tuple[list[int], float, str]:
    """(the grid's contexts, the probe's seconds, what it did) of one size's probe."""
    pr = k.probe
    largest, tried = probe_largest(k, cost, size)
    contexts = grid_contexts(largest, pr.above, pr.count)
    ran = [pr.start << i for i in range(tried)][: tried if largest else 0]
    run = PROBE_TRY_S * tried + sum(
        cost.step_s(size, c, k.batch_size, pr.mode, k.precision)
        for c in ran
        if largest and c <= largest
    )
    return contexts, run, f"probe: {tried} tried, contexts {contexts}; "


def _captures_s(k: ProfileKnobs, cost: Costs, size: str, ctx: int) -> float:
    """One context's captures (an `oom` row where the step cannot fit: its capture's cost) and
    the harness's forward beside them (nsys_profile (a))."""
    run, batch = 0.0, k.batch_size
    h = k.harness
    if "forward" in k.modes and h is not None and h.measure_steps:
        n = h.warmup_steps + h.measure_steps
        run += n * cost.step_s(size, ctx, batch, "forward", k.precision)
    for mode in k.modes:
        run += cost.dev.capture_s
        if cost.fits(cost.step_gib(size, ctx, batch, mode, k.precision)):
            steps = k.warmup_steps + k.measure_steps
            run += steps * cost.step_s(size, ctx, batch, mode, k.precision)
    return run


def estimate(k: ProfileKnobs, cost: Costs) -> list[Job]:
    """One job per size: the probe (where the contexts are `probe`), then a capture per
    context and mode, and the model's build."""
    jobs = []
    for size in k.sizes:
        contexts, run, how = k.context_lengths, 0.0, ""
        if contexts == "probe":
            contexts, run, how = _probe_s(k, cost, size)
        run += sum(_captures_s(k, cost, size, ctx) for ctx in contexts)
        run += cost.build_s(size)
        points = len(contexts) * len(k.modes)
        jobs.append(Job("profile", size, cost.dev.job_start_s + run, f"{how}{points} captures"))
    return jobs


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("sizes", cfg["sizes"], facts)
    probe = cfg.get("probe")
    if cfg["context_lengths"] == "probe" and not probe:
        at.fail("probe", None, "a probe block (start, max, mode, above, count) for `probe`")
    if probe:
        at.at("probe").at_most("start", probe["start"], "max", probe["max"])
    nsys = cfg.get("nsys", "")
    if any(c in nsys for c in "\n\r\0"):
        at.fail("nsys", nsys, "a path on one line")
    elif facts.running and facts.gpus and "profile" in facts.stages and (why := nsys_problem(nsys)):
        # where the run happens here (a GPU is visible), the path must be this host's nsys
        at.fail("nsys", nsys, why)
