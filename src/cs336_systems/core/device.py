"""Device helpers: which device, autocast per precision, GPU and core counts, compile limits.

Importing it does not import torch (a stage's launching process counts cards and cores without
it: torch's import takes seconds on a GPU host); each function that needs torch imports it."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16")


def pick_device(name: str = "auto") -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(precision: str, device: torch.device):
    import torch

    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"unknown precision {precision!r}; known: {PRECISIONS}")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def free_memory_mib(device: torch.device) -> float | None:
    """Memory free for new tensors on `device` now (MiB): the GPU's (with the caching
    allocator's unused blocks), or the host's available memory for a CPU; None when unknown."""
    if device.type == "cuda":
        import torch

        # the driver's free memory plus the blocks PyTorch's caching allocator holds unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return (torch.cuda.mem_get_info(device)[0] + cached) / 2**20
    from cs336_systems.planning.machine import host_memory_mib

    return host_memory_mib("MemAvailable")


def memory_shortfall(
    need_mib: float, device: torch.device, what: str, free_mib: float | None = None
) -> str | None:
    """A `skipped:` status when `what` needs more memory than `device` has free (`free_mib`,
    read now when not given), else None."""
    free = free_mib if free_mib is not None else free_memory_mib(device)
    if free is None or need_mib <= free:
        return None
    return f"skipped: {what} needs {need_mib:,.0f} MiB; {free:,.0f} MiB free on {device.type}"


def gpu_count() -> int:
    """The GPUs this process may use: the cards planning/claim.py claimed for its job (free
    cards of this host, which CUDA_VISIBLE_DEVICES names: no torch needed to count them), else
    those torch sees."""
    from cs336_systems.planning.claim import CLAIMED_ENV

    if claimed := os.environ.get(CLAIMED_ENV, "").strip():
        return len(claimed.split(","))
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def allow_recompiles(limit: int = 64) -> None:
    """Each head dim (and dtype) is a new specialisation of the compiled function; dynamo's
    default limit of 8 would silently fall back to eager after that."""
    import torch._dynamo.config as dcfg

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dcfg, name):
            setattr(dcfg, name, max(limit, getattr(dcfg, name)))
