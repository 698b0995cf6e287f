"""How much of the communication kernels' time ran while compute kernels ran: from one profiled
step (torch.profiler, CUDA kernels), as the DDP and FSDP stages report it."""

from __future__ import annotations

from pathlib import Path

import torch

from cs336_systems.core.harness import StepClock, synchronize


def profile_step(step, device, trace_path: Path | None) -> dict:
    """One profiled step: Chrome trace, and (GPU) the share of NCCL kernel time overlapped."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        step(StepClock(device))
        synchronize(device)
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    if device.type != "cuda":
        return {}
    comm, compute = [], []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        span = (ev.time_range.start, ev.time_range.end)
        (comm if "nccl" in ev.name.lower() else compute).append(span)
    return overlap_stats(comm, compute)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def overlap_stats(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> dict:
    """Total communication-kernel time (ms) and the part of it during compute kernels (us in)."""
    c, k = _union(comm), _union(compute)
    total = sum(b - a for a, b in c)
    both, j = 0.0, 0
    for a, b in c:
        while j < len(k) and k[j][1] <= a:
            j += 1
        m = j
        while m < len(k) and k[m][0] < b:
            both += max(0.0, min(b, k[m][1]) - max(a, k[m][0]))
            m += 1
    return {
        "prof_comm_kernel_ms": total / 1e3,
        "prof_comm_overlapped_ms": both / 1e3,
        "prof_overlap_share": both / total if total else float("nan"),
    }
