"""The one benchmark harness: every time the project measures goes through one of these.

Which to use when:
- ``time_steps(step, warmup, steps, device)``: whole steps (a training step, a forward pass):
  each bracketed by device synchronizations and read on the host clock; returns the warm-up and
  the measured per-step times (ms), for ``summarize`` (mean, std, median, min, max).
- ``StepClock(device)``: marks inside one step (``mark("backward")``, then ``ms(a, b)``): CUDA
  events on a GPU, so marking adds no synchronization; the host clock on a CPU.
  ``time_marked_steps(step, warmup, steps, device, spans)`` is ``time_steps`` for such a step:
  the whole step on the synchronized host clock, and each named span between two marks.
- ``device_time(fn, device, prefix)``: one kernel or a short device call, timed on the device:
  ``triton.testing.do_bench`` on CUDA (CUDA events per run, L2 cache flushed before each run,
  its warm-up and repetition budgets in ms, median or named quantiles); ``time_steps`` on a CPU,
  where do_bench cannot run. Returns named statistics (``<prefix>_ms_median``, ...).
- ``Stopwatch()``: plain wall-clock time of something that is not device work (a compile, a
  subprocess, the whole job, a first call after an explicit ``synchronize``): no
  synchronization of its own.

Around them: ``run_point`` turns an out-of-memory error or any other exception into a status
(`oom`, `error: <reason>`) and releases memory between points; ``summarize`` names statistics
`<prefix>_ms_<stat>`.

Importing it does not import torch (the distributed stages' launching processes import it, and
torch's import takes seconds on a GPU host): each function that needs torch imports it.
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cs336_systems.planning.log import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)


def synchronize(device: torch.device | str | None = None) -> None:
    import torch

    device = torch.device(device) if device is not None else None
    if (device is None or device.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


def release_memory() -> None:
    """Free what the last point left behind so the next one starts clean."""
    import torch

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


def pipelined_ms(step: Callable[[], Any], steps: int, device: torch.device | str = "cpu") -> float:
    """Mean ms of `steps` steps issued back to back, one synchronization before and one after:
    the rate a training loop runs at (the host queues the next step while the device works, as
    triton.testing.do_bench times the course's leaderboard), unlike time_steps' synchronized
    steps (the handout's benchmarking method), which also count the device idling while the host
    issues each step's first kernels."""
    if steps < 1:
        raise ValueError(f"need steps >= 1, got {steps}")
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3 / steps


def issue_ms(fn: Callable[[], Any], reps: int, device: torch.device | str = "cuda") -> float:
    """The host's time to issue `fn` (ms, median of `reps`), the device drained before each and
    nothing synchronized inside the timing: near a call's device time, the call is host-bound."""
    times = []
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    synchronize(device)
    return sorted(times)[reps // 2]


def is_oom(exc: BaseException) -> bool:
    import torch

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
        # the traceback: to the job's log alone under the workflow (planning/log.py)
        log.warning("point failed with %s", status, extra={"detail": tb.rstrip()})
        return PointResult(status, None, tb)
    finally:
        release_memory()


def peak_memory_mb(device: torch.device | str) -> float:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return float("nan")


class StepClock:
    """Marks inside one step: CUDA events on GPU (no extra synchronization), host clock on CPU.

    ``ms(a, b)`` waits for the two marks' events to complete (a no-op after a synchronize).
    """

    def __init__(self, device: torch.device | str):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.marks: dict[str, Any] = {}
        self._event = torch.cuda.Event

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = self._event(enable_timing=True)
            ev.record()
            self.marks[name] = ev
        else:
            self.marks[name] = time.perf_counter()

    def ms(self, a: str, b: str) -> float:
        if self.cuda:
            self.marks[a].synchronize()
            self.marks[b].synchronize()
            return self.marks[a].elapsed_time(self.marks[b])
        return (self.marks[b] - self.marks[a]) * 1e3


def time_marked_steps(
    step: Callable[[StepClock], Any],
    warmup: int,
    steps: int,
    device: torch.device | str,
    spans: dict[str, tuple[str, str]],
    with_warmup: bool = False,
) -> dict[str, list[float]]:
    """``time_steps`` for a step with parts: `step(clock)` marks its parts on a fresh StepClock.

    Returns, per measured step, ``step`` (the whole step, host clock, synchronized at both
    ends) and each span ``name: (mark_a, mark_b)`` in ms; `with_warmup`: ``warmup`` too, the
    warm-up steps' whole times.
    """
    clocks: list[StepClock] = []
    warm, totals = time_steps(
        lambda: step(clocks[-1]),
        warmup,
        steps,
        device,
        on_step=lambda _phase, _i: clocks.append(StepClock(device)),
    )
    measured = clocks[warmup:]
    out = {"step": totals, **({"warmup": warm} if with_warmup else {})}
    for name, (a, b) in spans.items():
        out[name] = [c.ms(a, b) for c in measured]
    return out


def timer_name(device: torch.device | str) -> str:
    """What ``device_time`` uses on `device`: ``do_bench`` (CUDA) or ``time_steps``."""
    import torch

    return "do_bench" if torch.device(device).type == "cuda" else "time_steps"


def _quantile_name(q: float) -> str:
    return "median" if q == 0.5 else f"p{q * 100:g}"


def device_time(
    fn: Callable[[], Any],
    device: torch.device | str,
    prefix: str,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    quantiles: Sequence[float] | None = None,
    grad_to_none: Sequence[torch.Tensor] | None = None,
    warmup_steps: int = 1,
    steps: int = 3,
) -> dict[str, float]:
    """Device time of `fn` (a kernel, a short device call), as named statistics in ms.

    CUDA: ``triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=...)``:
    CUDA events around each run, the L2 cache flushed before each, the gradients of
    `grad_to_none` reset to None before each. Without `quantiles`: ``<prefix>_ms_median``
    (do_bench's ``return_mode="median"``); with them: one key per quantile, in their order,
    0.5 named ``median`` and q named ``p<100 q>`` (``(0.5, 0.2, 0.8)``: median, p20, p80).

    CPU (do_bench needs a GPU): ``time_steps`` with `warmup_steps` and `steps`, the gradients
    reset before each step; ``summarize``'s keys (mean, std, median, min, max).
    """
    import torch

    grads = list(grad_to_none) if grad_to_none is not None else None
    if torch.device(device).type == "cuda":
        import triton.testing

        if quantiles is None:
            med = triton.testing.do_bench(
                fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median"
            )
            return {f"{prefix}_ms_median": float(med)}
        values = triton.testing.do_bench(
            fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, quantiles=list(quantiles)
        )
        values = values if isinstance(values, list | tuple) else [values]
        return {
            f"{prefix}_ms_{_quantile_name(q)}": float(v)
            for q, v in zip(quantiles, values, strict=True)
        }

    def step() -> None:
        for g in grads or ():
            g.grad = None
        fn()

    _, times = time_steps(step, warmup_steps, steps, device)
    return summarize(times, prefix)


class Stopwatch:
    """Wall-clock time (host ``perf_counter``) from creation to ``stop()`` or the end of a
    ``with`` block; read ``s`` or ``ms`` while it runs or after. It does not synchronize a
    device: for device work use the timers above, or synchronize before reading it.

        with Stopwatch() as sw:
            compile_things()
        log.info("compiled in %.1f s", sw.s)
    """

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._t1: float | None = None

    def stop(self) -> float:
        """Freeze the time (seconds); later reads return it."""
        if self._t1 is None:
            self._t1 = time.perf_counter()
        return self.s

    @property
    def s(self) -> float:
        end = self._t1 if self._t1 is not None else time.perf_counter()
        return end - self._t0

    @property
    def ms(self) -> float:
        return self.s * 1e3

    def __enter__(self) -> Stopwatch:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
