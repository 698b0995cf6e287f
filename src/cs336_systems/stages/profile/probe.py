"""The profile stage's 2026 grid: the largest context that fits, found by doubling.

``probe`` runs one step of `mode` (default forward+backward, the profiled mode that needs the
most memory short of the optimizer) per context, from `start`, doubling while the step runs and
the context is at most `cap`; the first failure (`oom`, or any error) stops it. Every tried
context is a row with its status and peak memory; the largest that ran is the probe's result.
``plan.grid_contexts`` then picks the `count` powers of two ending at that result, each above
`above` (the handout: "three power-of-two context lengths above 128, the largest being the
longest that fits in memory"). The profile job runs the probe itself, before its profiler, so
the grid is decided within one job and planning needs no GPU.
"""

from __future__ import annotations

import torch

from cs336_systems.core.harness import run_point, synchronize
from cs336_systems.core.workload import Workload
from cs336_systems.planning.log import get_logger, point, status_level

MiB = 2**20

log = get_logger(__name__)


def try_context(
    size: str,
    context: int,
    batch: int,
    precision: str,
    mode: str,
    device: torch.device,
    edition: str | None = None,
) -> dict:
    """Build the model at `context` and run one `mode` step; the peak memory it took."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    work = Workload.build(size, context, batch, device, edition=edition)
    step, cleanup = work.step(mode, precision, False)
    try:
        step()
        synchronize(device)
    finally:
        cleanup()
    peak = torch.cuda.max_memory_allocated(device) / MiB if cuda else float("nan")
    return {"peak_allocated_mb": peak}


def probe(
    size: str,
    batch: int,
    precision: str,
    mode: str,
    start: int,
    cap: int,
    device: torch.device,
    edition: str | None = None,
) -> tuple[list[dict], int | None]:
    """(one row per tried context, the largest context whose step ran or None)."""
    rows: list[dict] = []
    largest = None
    context = start
    while context <= cap:
        with point(size, f"ctx{context}", "probe", mode):
            res = run_point(
                lambda c=context: try_context(size, c, batch, precision, mode, device, edition)
            )
            log.log(status_level(res.status), "probe %s", res.status)
        rows.append({"context_length": context, "status": res.status, **(res.value or {})})
        if res.status != "ok":
            break
        largest = context
        context *= 2
    stop = "cap" if context > cap else "failure"
    for r in rows:
        r.update(
            {
                "probe_mode": mode,
                "probe_start": start,
                "probe_cap": cap,
                "largest_fitting": largest if largest is not None else float("nan"),
                "stopped_by": stop,
            }
        )
    return rows, largest
