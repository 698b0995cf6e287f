"""The one benchmark harness every timing in the project goes through.

Warm up, synchronize before reading the clock, keep every per-step time, report mean, std and
median; an out-of-memory or any other exception becomes a status, and memory is released
between points.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


def synchronize(device: torch.device | str | None = None) -> None:
    device = torch.device(device) if device is not None else None
    if (device is None or device.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def release_memory() -> None:
    """Free what the last point left behind so the next one starts clean."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def summarize(times_ms: list[float], prefix: str) -> dict[str, float]:
    """mean/std/median/min/max of per-step times, named `<prefix>_ms_<stat>` (std: sample std)."""
    if not times_ms:
        nan = float("nan")
        return {f"{prefix}_ms_{s}": nan for s in ("mean", "std", "median", "min", "max")}
    return {
        f"{prefix}_ms_mean": statistics.fmean(times_ms),
        f"{prefix}_ms_std": statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        f"{prefix}_ms_median": statistics.median(times_ms),
        f"{prefix}_ms_min": min(times_ms),
        f"{prefix}_ms_max": max(times_ms),
    }


def time_steps(
    step: Callable[[], Any],
    warmup: int,
    steps: int,
    device: torch.device | str = "cpu",
    on_step: Callable[[str, int], Any] | None = None,
) -> tuple[list[float], list[float]]:
    """Run `warmup` untimed-in-stats steps, then `steps` measured ones.

    Returns (warm-up step times, measured step times) in ms; each step is bracketed by
    device synchronizations so the host clock sees the work. `on_step(phase, i)` is called
    before each step (the profiler stage uses it for NVTX ranges and capture windows).
    """
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    warm, measured = [], []
    for phase, count, sink in (("warmup", warmup, warm), ("measure", steps, measured)):
        for i in range(count):
            if on_step is not None:
                on_step(phase, i)
            synchronize(device)
            t0 = time.perf_counter()
            step()
            synchronize(device)
            sink.append((time.perf_counter() - t0) * 1e3)
    return warm, measured


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError | MemoryError) and (
        "out of memory" in msg or "can't allocate memory" in msg or isinstance(exc, MemoryError)
    )


def short_reason(exc: BaseException, limit: int = 160) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:limit].replace(",", ";")


@dataclass
class PointResult:
    status: str
    value: Any = None
    error: str = ""
    extra: dict = field(default_factory=dict)


def run_point(fn: Callable[[], Any]) -> PointResult:
    """Run one experiment point; OOM -> status `oom`, any other exception -> `error: <reason>`.

    Memory is released afterwards whatever happened, so a failed point cannot poison the next.
    """
    try:
        return PointResult("ok", fn())
    except Exception as exc:  # a failed point is a row, not a crash
        status = "oom" if is_oom(exc) else f"error: {short_reason(exc)}"
        tb = traceback.format_exc(limit=4)
        print(f"[harness] point failed with {status}\n{tb}", flush=True)
        return PointResult(status, None, tb)
    finally:
        release_memory()


def peak_memory_mb(device: torch.device | str) -> float:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return float("nan")


class StepClock:
    """Marks inside one step: CUDA events on GPU (no extra synchronization), host clock on CPU."""

    def __init__(self, device):
        import torch

        self.cuda = device.type == "cuda"
        self.device = device
        self.marks: dict[str, object] = {}
        self._torch = torch

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[name] = ev
        else:
            self.marks[name] = time.perf_counter()

    def ms(self, a: str, b: str) -> float:
        if self.cuda:
            return self.marks[a].elapsed_time(self.marks[b])
        return (self.marks[b] - self.marks[a]) * 1e3
