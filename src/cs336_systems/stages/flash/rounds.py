"""Stage `flash`, the target job's paired rounds: after a point's own measurements, the
forward+backward of its implementations timed again, back to back on one set of inputs, for
`rounds` rounds (odd rounds in the reverse order), so that a drift of the host between two
implementations' windows falls on both. The analysis judges the target on the median of the
rounds' ratios (analysis.py: `fixed_cost`).

Columns added to each implementation's row: `fwd_bwd_rounds_ms` (each round's median, in the
rounds' order, space-separated), `fwd_bwd_rounds_ms_median` (their median), and
`rounds_status` (`ok`, or why the rounds did not run). The analysis reads them back with
`parse_rounds`; this module loads torch only when it measures."""

from __future__ import annotations

import statistics
from collections.abc import Callable

ROUNDS_MS = "fwd_bwd_rounds_ms"


def point_inputs(shape: tuple[int, ...], dtype, device) -> tuple:
    """A point's q, k, v (requiring gradients) and dO, random, seeded by the point's length and
    head dim: the same for every implementation, its own measurements and its rounds."""
    import torch

    g = torch.Generator(device=device).manual_seed(shape[2] * 7 + shape[3])
    q, k, v, do = (torch.randn(shape, generator=g, device=device).to(dtype) for _ in "qkvd")
    for x in (q, k, v):
        x.requires_grad_()
    return q, k, v, do


def time_rounds(
    fns: dict[str, Callable], shape: tuple[int, ...], dtype, device, timer, rounds: int
) -> dict[str, list[float]]:
    """Each implementation's forward+backward median (ms) per round: every round times each
    implementation once with `timer` (the job's do_bench windows), in `fns`' order in even rounds
    and the reverse in odd ones."""
    q, k, v, do = point_inputs(shape, dtype, device)
    times: dict[str, list[float]] = {impl: [] for impl in fns}
    for r in range(rounds):
        for impl in list(fns) if r % 2 == 0 else list(reversed(fns)):
            fn = fns[impl]
            t = timer(lambda fn=fn: fn(q, k, v).backward(do), "round", [q, k, v])
            times[impl].append(float(t["round_ms_median"]))
    return times


def needs_rounds(rows: list[dict]) -> bool:
    """Whether one point's rows (one per implementation) should get paired rounds: every
    implementation passed, and the rounds are not there yet (a resumed job's kept rows)."""
    return all(r["status"] == "ok" for r in rows) and any(
        r.get("rounds_status") != "ok" for r in rows
    )


def add_rounds(rows: list[dict], fns: dict[str, Callable], shape: tuple[int, ...], dtype,
               device, timer, rounds: int) -> None:  # fmt: skip
    """The paired rounds of one point's `rows` (one per implementation; `fns` by implementation
    name), on the inputs the point's own measurements used, written into the rows; a failure
    (OOM, an error) is their `rounds_status`, never raised."""
    from cs336_systems.core.harness import is_oom, release_memory, short_reason
    from cs336_systems.planning.log import get_logger, status_level

    impls = {row["impl"]: fns[row["impl"]] for row in rows}
    try:
        times = time_rounds(impls, shape, dtype, device, timer, rounds)
        for row in rows:
            ms = times[row["impl"]]
            row[ROUNDS_MS] = " ".join(f"{x:.5g}" for x in ms)
            row[f"{ROUNDS_MS}_median"] = statistics.median(ms)
            row["rounds_status"] = "ok"
    except Exception as exc:
        for row in rows:
            row["rounds_status"] = "oom" if is_oom(exc) else f"error: {short_reason(exc)}"
    finally:
        release_memory()
    get_logger(__name__).log(
        status_level(rows[0]["rounds_status"]),
        "%s %s",
        rows[0]["rounds_status"],
        " / ".join(f"{r['impl']} {r.get(ROUNDS_MS, '')}" for r in rows),
    )


def parse_rounds(value) -> list[float]:
    """`fwd_bwd_rounds_ms` back as floats ([] where absent; a CSV reader makes one round a
    number)."""
    if isinstance(value, str):
        return [float(x) for x in value.split()]
    return [float(value)] if isinstance(value, int | float) and value == value else []
