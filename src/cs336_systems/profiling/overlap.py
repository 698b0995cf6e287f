"""How much of the communication kernels' time ran while compute kernels ran: from one profiled
step (torch.profiler, CUDA kernels), as the DDP and FSDP stages report it.

`collective_overlap` also splits out the all-gathers (on the GPU with the time compute waited
for them: `waited_for`) and works on the CPU: there gloo runs each collective on a worker thread
(`gloo:all_gather`, ... events with their durations) and compute is the time the main thread
spends inside ATen operators (a thread blocked in `wait()` is in none).
"""

from __future__ import annotations

import bisect
import math
import re
from pathlib import Path

STEP_RANGE = "profiled_step"


def profile_step(
    step,
    device,
    trace_path: Path | None,
    per_collective: bool = False,
    forward_gathers=None,
    timeline_path: Path | None = None,
) -> dict:
    """One profiled step: Chrome trace, and (GPU) the share of NCCL kernel time overlapped;
    with `per_collective`, `collective_overlap`'s columns too (on the CPU as well). The step's
    wall time (`prof_step_ms`: host start to its last kernel's end) and, on a GPU, the part of
    it any kernel ran (`prof_gpu_busy_ms`), communication ran alone (`prof_comm_exposed_ms`)
    and nothing ran (`prof_gpu_idle_ms`: the GPU waited for the host), which add up to it.

    In a process group the ranks meet at a barrier (inside the profile, before the step's
    range) so that the step starts together on every rank: a rank that reached it later (the
    last step's memory marks, the profiler's own start) would otherwise stretch the other's
    first collectives by its lateness. Only what starts inside the step's range counts.

    `timeline_path`: the step's window of the trace saved there (`nsys_timeline.save`: what
    the stages' timeline figures read, a few hundred kB where the trace has tens of MB)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from cs336_systems.core.harness import StepClock, synchronize
    from cs336_systems.profiling.timeline import gpu_kernels, split_step, step_window

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        _align_ranks(device)
        with record_function(STEP_RANGE):
            step(StepClock(device))
        synchronize(device)
    keep_trace(prof, trace_path, timeline_path)
    if device.type != "cuda":
        r = _host_range(prof)
        extra = (
            collective_overlap(prof, device, forward_gathers, since=r.start)
            if per_collective
            else {}
        )
        return {**extra, "prof_step_ms": (r.end - r.start) / 1e3}
    kernels = gpu_kernels(prof)
    window = step_window(prof, STEP_RANGE, kernels)
    kernels = [k for k in kernels if k.start_us >= window[0]]  # not the barrier's
    extra = collective_overlap(prof, device, forward_gathers, kernels) if per_collective else {}
    split = split_step(kernels, window, lambda path: "compute")
    extra.update(
        prof_step_ms=split["window"],
        prof_gpu_busy_ms=split["compute_busy"] + split["communication_exposed"],
        prof_comm_exposed_ms=split["communication_exposed"],
        prof_gpu_idle_ms=split["idle"],
    )
    spans, compute = _split_kernels(kernels)
    return {**overlap_stats(spans["comm"], compute), **extra}


# the phase each of a step's marks begins (the FSDP step's marks; "stepped" ends the last)
STEP_PHASES = {"start": "forward", "forward": "backward", "backward": "sync", "synced": "optimizer"}


class MarkRanges:
    """A step's marks as record_function ranges on the profiler's timeline: each mark closes
    the open range and opens the one `phases` names for it (none: the last one closed). Marks
    come on one thread in order, so the ranges nest nowhere and need no stack."""

    def __init__(self, phases: dict[str, str] = STEP_PHASES):
        self.phases = phases
        self.open = None

    def __call__(self, mark: str) -> None:
        from torch.autograd.profiler import record_function

        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None
        if mark in self.phases:
            self.open = record_function(self.phases[mark])
            self.open.__enter__()


def rank_trace(trace_dir: str | None, name: str, rank: int) -> Path | None:
    """Where `rank` keeps the Chrome trace of the profiled step `name`: one folder per step,
    `<trace_dir>/<name>/rank<k>.json.gz`, every rank's trace in it (gzipped; torch.profiler
    writes `distributedInfo` with the rank into each when a process group is up), the folder
    Perfetto's users and HolisticTraceAnalysis open as one run. None without `trace_dir`."""
    return Path(trace_dir) / name / f"rank{rank}.json.gz" if trace_dir else None


# gzip's fastest level: torch's own `.gz` export compresses at level 9, seconds for a GPU
# step's tens of MB of JSON while the job holds its cards; level 1 is several times faster
# and the file about a third larger
TRACE_GZIP_LEVEL = 1


def gzip_file(source: Path, out: Path) -> None:
    import gzip
    import shutil

    with open(source, "rb") as fin, gzip.open(out, "wb", compresslevel=TRACE_GZIP_LEVEL) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def keep_trace(prof, trace_path: Path | None, timeline_path: Path | None) -> None:
    """The Chrome trace at `trace_path` (gzipped where it ends in `.gz`), and the step range's
    window of it at `timeline_path` (either may be None), from one export: the window is read
    from the plain JSON before it is compressed. A timeline that cannot be written is logged,
    not raised: the step's numbers do not depend on it."""
    import shutil
    import tempfile

    from cs336_systems.planning.log import get_logger
    from cs336_systems.profiling.nsys_timeline import save_window

    if trace_path is None and timeline_path is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        if timeline_path is not None:
            try:
                save_window(raw, re.escape(STEP_RANGE), timeline_path)
            except (OSError, ValueError, KeyError) as exc:
                get_logger(__name__).warning("no timeline %s: %s", timeline_path.name, exc)
        if trace_path is not None:
            trace_path = Path(trace_path)
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            if trace_path.suffix == ".gz":
                gzip_file(raw, trace_path)
            else:
                shutil.copyfile(raw, trace_path)


def _align_ranks(device) -> None:
    """Every rank of the default process group past one barrier, its device idle (no-op
    without a process group)."""
    import torch.distributed as dist

    from cs336_systems.core.harness import synchronize

    if not (dist.is_available() and dist.is_initialized()):
        return
    synchronize(device)
    if device.type == "cuda" and dist.get_backend() == "nccl":
        dist.barrier(device_ids=[device.index if device.index is not None else 0])
    else:
        dist.barrier()
    synchronize(device)


def _host_range(prof):
    """The step range's host interval (its device-side copy, where there is one, is not)."""
    from torch.autograd import DeviceType

    ranges = [e for e in prof.events() if e.name == STEP_RANGE and e.device_type == DeviceType.CPU]
    return ranges[-1].time_range


def _split_kernels(kernels) -> tuple[dict[str, list[tuple[float, float]]], list]:
    """({"comm": NCCL kernels, "all_gather": the all-gathers among them}, the other kernels) as
    (start, end) spans. Kernels only (`timeline.gpu_kernels`): the step's record_function range
    is also a device event spanning them all, and counted as compute it would hide every
    collective."""
    spans: dict[str, list[tuple[float, float]]] = {"all_gather": [], "comm": []}
    compute: list[tuple[float, float]] = []
    for k in kernels:
        span = (k.start_us, k.end_us)
        if "nccl" in k.name.lower():
            spans["comm"].append(span)
            if _is_all_gather(k.name):
                spans["all_gather"].append(span)
        else:
            compute.append(span)
    return spans, compute


def _is_all_gather(name: str) -> bool:
    name = name.lower()
    return "allgather" in name or "all_gather" in name


def collective_overlap(
    prof, device, forward_gathers: int | None = None, kernels=None, since: float | None = None
) -> dict:
    """`prof_<kind>_ms`, `_overlapped_ms`, `_overlap_share` for kind `all_gather` and `comm` (all
    collectives): on GPU NCCL kernels against the other kernels, on CPU gloo's worker-thread
    spans against the main thread's ATen operators. With `forward_gathers` (how many
    all-gathers the forward issues; collectives run in the order they are issued), the first
    that many all-gathers are kind `all_gather_fwd`, the others `all_gather_bwd`. `kernels`:
    the profile's `timeline.gpu_kernels`, where the caller has them already. On the GPU also
    `prof_<all-gather kind>_waited_ms`: the time compute waited for a gather (`waited_for`).
    `since` (CPU): events starting earlier (a barrier before the step) are left out."""
    if device.type == "cuda":
        from cs336_systems.profiling.timeline import gpu_kernels

        spans, compute = _split_kernels(kernels if kernels is not None else gpu_kernels(prof))
    else:
        spans = {"all_gather": [], "comm": []}
        compute = []
        events = list(prof.events())
        threads = [ev.thread for ev in events if ev.name.startswith("aten::")]
        main = max(set(threads), key=threads.count) if threads else None
        for ev in events:
            if since is not None and ev.time_range.start < since:
                continue
            span = (ev.time_range.start, ev.time_range.end)
            if ev.name.startswith("gloo:"):
                spans["comm"].append(span)
                if _is_all_gather(ev.name):
                    spans["all_gather"].append(span)
            elif ev.thread == main and ev.name.startswith("aten::"):
                compute.append(span)
    if forward_gathers is not None:
        ordered = sorted(spans["all_gather"])
        spans["all_gather_fwd"] = ordered[:forward_gathers]
        spans["all_gather_bwd"] = ordered[forward_gathers:]
    out = {}
    for kind, comm in spans.items():
        stats = overlap_stats(comm, compute)
        out[f"prof_{kind}_ms"] = stats["prof_comm_kernel_ms"]
        out[f"prof_{kind}_overlapped_ms"] = stats["prof_comm_overlapped_ms"]
        out[f"prof_{kind}_overlap_share"] = stats["prof_overlap_share"]
        if device.type == "cuda" and kind.startswith("all_gather"):
            out[f"prof_{kind}_waited_ms"] = waited_for(comm, compute) / 1e3 if comm else math.nan
    out["prof_compute_ms"] = sum(b - a for a, b in _union(compute)) / 1e3
    return out


# a compute kernel starting this soon after a gather's end was released by it (a stream wait
# on the gather's event: the measured release takes 2-3 us on an H200)
RELEASE_US = 10.0


def waited_for(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """Microseconds the compute waited for these collectives: for each one after whose end a
    compute kernel starts within RELEASE_US with no compute running at its end, the compute-idle
    time up to its end since it started (or since the last compute kernel ended, if later).

    Overlap and waiting differ where the host is slow: a gather issued before a block whose
    kernels the host launches no faster than the GPU runs them finds the GPU idle between
    kernels and overlaps little, yet the compute never waits for it; what waits is a kernel
    launched early and held back by a stream wait on the gather, which starts the moment the
    gather ends. Kernel times alone show that moment: no launch times needed."""
    busy = _union(compute)
    starts = sorted(a for a, _ in compute)
    ends = [b for _, b in busy]
    total = 0.0
    for a, b in comm:
        i = bisect.bisect_left(starts, b)
        if i == len(starts) or starts[i] > b + RELEASE_US:
            continue  # no compute kernel released by this one's end
        j = bisect.bisect_left(ends, b) - 1  # the last busy span ending before b
        if j + 1 < len(busy) and busy[j + 1][0] < b:
            continue  # compute was running at its end: nothing waited
        idle_from = max(a, ends[j]) if j >= 0 else a
        total += max(0.0, b - idle_from)
    return total


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
