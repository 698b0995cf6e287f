"""HolisticTraceAnalysis's temporal breakdown and communication-computation overlap, per rank,
from a folder of per-rank torch.profiler Chrome traces (`overlap.rank_trace`), with HTA's own
definitions (holistictraceanalysis 0.5.0) in our code: HTA itself pulls in JupyterLab and its
server stack (about 100 packages, 300 MB) for what is a few interval sums here.

HTA's definitions, as its documentation and behaviour describe them (checked against HTA 0.5.0
itself on random two-rank traces: the same idle, compute and overlap figures):

- a rank's trace is the file whose `distributedInfo` names that rank;
- its GPU events are the complete events with a `stream` argument (kernels, memcpy, memset);
  their start is rounded up and their end down to whole microseconds (HTA's parser, against
  ns-resolution events that overlap by rounding);
- a kernel is communication if its name matches `^nccl.*Kernel`, memory if `^Memcpy`,
  `^Memset` or `^dma`, compute unless its name matches `(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|
  (.*Sync)` (the classes HTA reports);
- without ProfilerStep ranges (our traces have none: one step, no schedule) every GPU event of
  the trace counts, from the first one's start to the last one's end (`kernel_time`);
- idle: that span less the union of all events; compute: the union of compute events; the rest
  is non-compute, split here by what runs (communication, else memory and other kernels);
- overlap: the part of the union of communication events inside the union of compute events,
  over the union of communication events.

`breakdown` takes switches that each swap one of these for ours (`overlap.profile_step`): the
step's kernels only, exact times, our kernel classes, our window. The report turns HTA's
definitions into ours one switch at a time to say which one makes a difference (reporting/
hta_check.py).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from cs336_systems.profiling.overlap import STEP_RANGE, overlap_stats

COMM_RE = re.compile(r"^nccl.*Kernel")
MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


@dataclass
class RankTrace:
    """One rank's GPU events (name, start, end in microseconds as the trace has them), its
    profiled step's host range (None where the trace has none) and, for a trace without GPU
    events, what it holds instead (host events, gloo's collective spans)."""

    rank: int
    path: Path
    kernels: list[tuple[str, float, float]] = field(default_factory=list)
    step: tuple[float, float] | None = None
    host_events: int = 0
    gloo_events: int = 0


def read_rank(path: str | Path) -> RankTrace:
    """A Chrome trace (``.json`` or ``.json.gz``) as a `RankTrace`; its rank from
    `distributedInfo` (0 where it has none, as HTA assumes)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    rank = int((doc.get("distributedInfo") or {}).get("rank", 0))
    out = RankTrace(rank, path)
    for e in doc.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e or e.get("cat") == "Trace":
            continue
        args = e.get("args") or {}
        if args.get("stream", -1) != -1:
            out.kernels.append((str(e.get("name", "")), float(e["ts"]), e["ts"] + e["dur"]))
            continue
        out.host_events += 1
        name = str(e.get("name", ""))
        out.gloo_events += name.startswith("gloo:")
        if name == STEP_RANGE and e.get("cat") == "user_annotation":
            out.step = (float(e["ts"]), e["ts"] + e["dur"])
    return out


def read_folder(folder: str | Path) -> dict[int, RankTrace]:
    """Every rank's trace in `folder` (files ending in `.json` or `.gz`, as HTA lists them), by
    rank; {} where the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".gz")))
    traces = [read_rank(p) for p in files]
    return {t.rank: t for t in sorted(traces, key=lambda t: t.rank)}


def hta_class(name: str) -> str:
    """HTA's kernel type: communication, memory, compute or other."""
    if COMM_RE.match(name):
        return "communication"
    if MEMORY_RE.match(name):
        return "memory"
    return "other" if NOT_COMPUTE_RE.match(name) else "compute"


def our_class(name: str) -> str:
    """`overlap.profile_step`'s: NCCL anywhere in the name is communication, all else compute."""
    return "communication" if "nccl" in name.lower() else "compute"


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """HTA's `merge_kernel_intervals`: sorted by start, a span starting after every earlier
    one's end opens a new group; a group is its first start to its latest end."""
    groups: list[list[float]] = []
    latest = -math.inf
    for a, b in sorted(spans):
        if groups and a <= latest:
            groups[-1][1] = max(groups[-1][1], b)
        else:
            groups.append([a, b])
        latest = max(latest, b)
    return [(a, b) for a, b in groups]


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _minus(spans: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Length of the merged `spans` outside the merged `cover`."""
    return _length(spans) - overlap_stats(spans, cover)["prof_comm_overlapped_ms"] * 1e3


# HTA's definitions turned into ours one at a time, in this order (`breakdown`)
SWITCHES = ("step_only", "exact", "our_classes", "our_window")

# what `breakdown` returns, all in ms but `overlap` (a share)
MEASURES = ("overlap", "comm_ms", "communication_ms", "compute_ms", "memory_ms", "idle_ms")
MEASURES += ("window_ms",)


def _kernels(t: RankTrace, switches) -> list[tuple[str, float, float]]:
    kernels = t.kernels
    if "step_only" in switches and t.step is not None:
        kernels = [k for k in kernels if k[1] >= t.step[0]]
    if "exact" not in switches:
        kernels = [(n, float(math.ceil(a)), float(math.floor(b))) for n, a, b in kernels]
    return kernels


def breakdown(t: RankTrace, switches=()) -> dict[str, float]:
    """HTA's temporal breakdown and overlap of one rank (module doc), in ms (`overlap`: a
    share), each of `switches` (SWITCHES) swapping one of HTA's definitions for ours: only the
    kernels starting in the step's range, exact times, our kernel classes, our window (from the
    step's host start to its end or the last kernel's, whichever is later). NaN without GPU
    events."""
    kernels = _kernels(t, switches)
    if not kernels:
        return dict.fromkeys(MEASURES, math.nan)
    classify = our_class if "our_classes" in switches else hta_class
    every = merge([(a, b) for _, a, b in kernels])
    lo, hi = every[0][0], every[-1][1]
    if "our_window" in switches and t.step is not None:
        lo, hi = t.step[0], max(t.step[1], hi)
        every = [(max(a, lo), min(b, hi)) for a, b in every if min(b, hi) > max(a, lo)]
    compute = merge([(a, b) for n, a, b in kernels if classify(n) == "compute"])
    comm = merge([(a, b) for n, a, b in kernels if classify(n) == "communication"])
    idle = (hi - lo) - _length(every)
    alone = _minus(comm, compute)
    return {
        "overlap": overlap_stats(comm, compute)["prof_overlap_share"],
        "comm_ms": _length(comm) / 1e3,
        "communication_ms": alone / 1e3,
        "compute_ms": _length(compute) / 1e3,
        "memory_ms": ((hi - lo) - idle - _length(compute) - alone) / 1e3,
        "idle_ms": idle / 1e3,
        "window_ms": (hi - lo) / 1e3,
    }


def evidence(t: RankTrace) -> dict[str, float]:
    """What each switch changes in this trace, for the report's explanation: the kernels
    before the step's range and their NCCL time (`step_only`), the kernel time HTA's rounding
    drops (`exact`), the kernels HTA and we class apart and their time (`our_classes`), and
    the time from the step's host start to its first kernel (`our_window`); times in ms."""
    start = t.step[0] if t.step is not None else -math.inf
    before = [k for k in t.kernels if k[1] < start]
    inside = [k for k in t.kernels if k[1] >= start]
    apart = [k for k in inside if (hta_class(k[0]) == "compute") != (our_class(k[0]) == "compute")]
    rounded = _kernels(RankTrace(t.rank, t.path, inside), ())
    first = min((a for _, a, _ in inside), default=math.nan)
    return {
        "before_n": len(before),
        "before_comm_ms": sum(b - a for n, a, b in before if COMM_RE.match(n)) / 1e3,
        "rounding_n": len(inside),
        "rounding_ms": (sum(b - a for _, a, b in inside) - sum(b - a for _, a, b in rounded)) / 1e3,
        "apart_n": len(apart),
        "apart_ms": sum(b - a for _, a, b in apart) / 1e3,
        "lead_ms": (first - start) / 1e3 if t.step is not None else math.nan,
    }
