"""The ceilings stage's knobs (`CeilingsKnobs`, one per preset block of
config/stages/ceilings.yaml), the sizes each dtype is measured at, and what the workflow checks in
a block beyond its schema (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.config import Checker, Facts, device_memory
from cs336_systems.planning.estimate import Costs, EtaKeys, Job
from cs336_systems.planning.knobs import Knobs, knob

BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
Dtype = Literal["bf16", "tf32", "fp32", "fp16"]
SIZE = {"minimum": 16}  # the smallest square matmul measured


@dataclass(frozen=True)
class CeilingsKnobs(Knobs):
    """Measured matmul peaks and copy bandwidth."""

    matmul_size: int = knob("each dtype's square matmul size", **SIZE)
    dtypes: list[Dtype] = knob("the dtypes measured", minItems=1, uniqueItems=True)
    copy_mb: int = knob("MiB of the device-to-device copy", minimum=1)
    reps: int = knob(
        "timed calls of a measurement (CPU; at least 100 ms of them on a GPU)", minimum=1
    )
    matmul_size_of: dict[Dtype, int] | None = knob(
        "per-dtype sizes over matmul_size (a CPU's fp32 needs larger products to reach its peak"
        " than its bf16 can afford without bf16 units)",
        default=None,
        values=SIZE,
    )
    extra_sizes: dict[Dtype, list[int]] | None = knob(
        "more square sizes per dtype, measured beside its own; the best rate is the ceiling",
        default=None,
        values={"uniqueItems": True, "items": SIZE},
    )
    repeats: int | None = knob(
        "each (dtype, size) measured this many times; the best kept, every one reported",
        default=None,
        minimum=1,
    )
    warm_s: float | None = knob(
        "seconds of matmuls run before the first measurement (GPU clocks up from idle)",
        default=None,
        minimum=0,
    )


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = CeilingsKnobs


def size_of(k: CeilingsKnobs) -> dict[str, int]:
    """Each measured dtype's matmul size: `matmul_size`, or its entry in `matmul_size_of`."""
    own = k.matmul_size_of or {}
    return {d: own.get(d, k.matmul_size) for d in k.dtypes}


def sizes_of(k: CeilingsKnobs) -> dict[str, list[int]]:
    """Every square size each dtype is measured at: its own size, then its `extra_sizes`."""
    extra = k.extra_sizes or {}
    return {d: list(dict.fromkeys([n, *extra.get(d, [])])) for d, n in size_of(k).items()}


def as_measured(block: dict, rows) -> None:
    """`block` (in place) as the run whose rows (`rows`: a ceilings CSV, a DataFrame) measured:
    its sizes per dtype, repeats and warm-up spin (a run from before several sizes and repeats
    measured one size per dtype, once, cold). The time budget estimates a reference run's job
    by it (budget/measured.py)."""
    mm = rows[rows["kind"] == "matmul"]
    sizes = {d: sorted({int(n) for n in g["size"]}) for d, g in mm.groupby("dtype")}
    if not sizes:
        return
    block["matmul_size_of"] = {d: ns[0] for d, ns in sizes.items()}
    block["extra_sizes"] = {d: ns[1:] for d, ns in sizes.items() if len(ns) > 1}
    block["repeats"] = int(rows["repeat"].max()) if "repeat" in rows else 1
    block["warm_s"] = float(rows["warm_s"].max()) if "warm_s" in rows else 0.0


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"ceilings": lambda w: "ceilings"}
# do_bench's windows around a ceiling measurement on a GPU (100 ms warm-up, at least 100 ms of
# runs, reps ms where more: measure.py time_ms) and the calls it times first
DO_BENCH_CALLS = 6


def estimate(k: CeilingsKnobs, cost: Costs) -> list[Job]:
    """Every (dtype, path, size) `repeats` times: on a GPU do_bench's windows and its first
    calls, on a CPU the warm-up and `reps` calls at the measured rate; the warm-up spin and the
    copy."""
    dev, reps, repeats = cost.dev, k.reps, k.repeats or 1
    total, n = 0.0, 0
    for dtype, sizes in sizes_of(k).items():
        paths = 2 if dtype == "bf16" else 1  # bf16 also as the model runs it (autocast F.linear)
        rate = (dev.peak_tflops or dev.tflops).get(dtype, dev.tflops["fp32"]) * 1e12
        for size in sizes:
            call = 2.0 * size**3 / rate
            one = (
                (0.1 + max(reps, 100) / 1e3 + DO_BENCH_CALLS * call)
                if dev.gpus
                else ((1 + reps) * call)
            )
            total += paths * repeats * one
            n += paths * repeats
    total += (k.warm_s or 0) if dev.gpus else 0.0
    total += dev.job_start_s + dev.fixed_s["ceilings"]
    return [Job("ceilings", "ceilings", total, f"{n} matmul measurements and a copy")]


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """Sizes that fit the device's memory, where knowable: the copy's source and destination,
    the matmul's two operands and its product."""
    have, where = device_memory(facts)
    at.fits("copy_mb", cfg["copy_mb"], 2 * cfg["copy_mb"], have, where)
    widest: dict[int, str] = {}  # each size once, at its widest dtype
    for dtype, ns in sizes_of(CeilingsKnobs.from_block(cfg)).items():
        for n in ns:
            if n not in widest or BYTES[dtype] > BYTES[widest[n]]:
                widest[n] = dtype
    extra = {n for ns in cfg.get("extra_sizes", {}).values() for n in ns}
    for n, dtype in widest.items():
        key = (
            "matmul_size"
            if n == cfg["matmul_size"]
            else f"extra_sizes.{dtype}"
            if n in extra and n != cfg.get("matmul_size_of", {}).get(dtype)
            else f"matmul_size_of.{dtype}"
        )
        at.fits(key, n, 3 * n * n * BYTES[dtype] / 2**20, have, where)
