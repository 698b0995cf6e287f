"""One profiled step on the GPU's timeline: each kernel with its stream and the operators that
launched it, and the step's wall time split into parts that add up to it.

`gpu_kernels(prof)` reads torch.profiler's Kineto events: every kernel, memcpy and memset with
its start, end and stream (not the device-side copies of record_function ranges, which span
the kernels they enclose), and the path of CPU operators around the call that launched it
(outermost first, then the kernel's name, " / "-joined), found through the correlation id that
links a device event to its launching operator.

`split_step(kernels, window, classify)` walks the window (the step from its first host call to
its last kernel's end) once: at each instant the compute kernels running (any stream but the
communication ones) share it equally among their parts (`classify(path)`); an instant with only
communication kernels is exposed communication; one with neither is idle (the GPU waited for
the host). So the parts, exposed communication and idle add up to the window exactly, and a
host thread blocked in a launch (a full command queue) counts as nothing: only device time is
kernel time. Communication overlapped with compute is reported beside them (`hidden`), not in
the sum.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

COMM = re.compile(r"nccl|gloo|all_?gather|reduce_?scatter|all_?reduce|broadcast", re.IGNORECASE)


@dataclass(frozen=True)
class Kernel:
    start_us: float
    end_us: float
    stream: int
    name: str
    path: str  # launching operators, outermost first, then the kernel's name

    @property
    def is_comm(self) -> bool:
        return bool(COMM.search(self.name))


def gpu_kernels(prof) -> list[Kernel]:
    """Every device event of a torch.profiler run, with times relative to the trace's start
    (microseconds, as FunctionEvent's) and its launching operator path."""
    from torch.autograd import DeviceType

    results = prof.profiler.kineto_results
    t0 = results.trace_start_ns()
    ops = {}
    for e in prof.events():
        if e.device_type == DeviceType.CPU and not e.is_async:
            ops.setdefault(e.id, e)
    out = []
    for k in results.events():
        # a record_function range also appears on the device as a user annotation spanning its
        # kernels: work of nobody's, and counted as a kernel it would take half of every instant
        if k.device_type() != DeviceType.CUDA or k.is_user_annotation():
            continue
        chain, p = [], ops.get(k.linked_correlation_id())
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        start = (k.start_ns() - t0) / 1e3
        out.append(
            Kernel(
                start_us=start,
                end_us=start + k.duration_ns() / 1e3,
                stream=int(k.device_resource_id()),
                name=k.name(),
                path=" / ".join([*reversed(chain), k.name()]),
            )
        )
    return out


def step_window(prof, name: str, kernels: list[Kernel]) -> tuple[float, float]:
    """(start, end) in microseconds: the `name` record_function range's start on the host to
    the later of its end and its kernels' last end (the GPU finishes after the host returns).
    The range's device-side copy is not the step: it spans only the kernels the host launched
    one by one, none that a CUDA graph replay runs."""
    from torch.autograd import DeviceType

    ranges = [e for e in prof.events() if e.name == name and e.device_type == DeviceType.CPU]
    if not ranges:
        raise ValueError(f"no {name!r} range in the profile")
    r = ranges[-1].time_range
    inside = [k.end_us for k in kernels if k.start_us >= r.start]
    return r.start, max([r.end, *inside])


def split_step(
    kernels: list[Kernel], window: tuple[float, float], classify: Callable[[str], str]
) -> dict[str, float]:
    """Milliseconds of the window by part (module doc): one key per compute part met, plus
    ``communication_exposed``, ``idle``, ``window``; and, beside the sum, ``compute_busy``
    (any compute kernel running), ``communication_busy``, ``communication_hidden`` (both)."""
    lo, hi = window
    events: list[tuple[float, int, int]] = []  # (time, +1/-1, kernel index)
    for i, k in enumerate(kernels):
        a, b = max(k.start_us, lo), min(k.end_us, hi)
        if b > a:
            events += [(a, 1, i), (b, -1, i)]
    events.sort()
    parts: dict[str, float] = {}
    exposed = idle = hidden = comm_busy = compute_busy = 0.0
    running: set[int] = set()
    last = lo
    for t, kind, i in events:
        span = t - last
        if span > 0:
            compute = [j for j in running if not kernels[j].is_comm]
            comm = len(compute) < len(running)
            if compute:
                compute_busy += span
                for j in compute:
                    part = classify(kernels[j].path)
                    parts[part] = parts.get(part, 0.0) + span / len(compute)
                if comm:
                    hidden += span
            elif comm:
                exposed += span
            else:
                idle += span
            if comm:
                comm_busy += span
        running.add(i) if kind == 1 else running.discard(i)
        last = max(last, t)
    idle += hi - last
    out = {p: us / 1e3 for p, us in parts.items()}
    out.update(
        communication_exposed=exposed / 1e3,
        idle=idle / 1e3,
        window=(hi - lo) / 1e3,
        compute_busy=compute_busy / 1e3,
        communication_busy=comm_busy / 1e3,
        communication_hidden=hidden / 1e3,
    )
    return out
