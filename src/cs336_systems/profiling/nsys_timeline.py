"""A capture read as the rows of an Nsight Systems timeline: the NVTX (or record_function)
ranges, the compute kernels by stream, the communication kernels (NCCL; gloo's collectives on a
CPU), and the memory in use over time.

Three sources give the same `Timeline`:

- `read_sqlite(db)`: an ``nsys export --type=sqlite`` file (``nsys.export_sqlite``, or a copy
  trimmed by ``nsys.trim_sqlite``). Kernels from ``CUPTI_ACTIVITY_KIND_KERNEL`` (with the host
  time of their launch, from ``CUPTI_ACTIVITY_KIND_RUNTIME``), ranges from ``NVTX_EVENTS``, the
  memory track from ``CUDA_GPU_MEMORY_USAGE_EVENTS`` (``nsys profile --cuda-memory-usage=true``:
  cudaMalloc and cudaFree, so PyTorch's caching allocator shows as the segments it reserves).
- `read_chrome_trace(path)`: torch.profiler's Chrome trace (``.json`` or ``.json.gz``), where nsys
  is absent. Kernels (``cat: kernel``, stream in ``tid``), ranges (``user_annotation``), the
  memory track from ``[memory]`` events (``profile_memory=True``: the allocator's ``Total
  Allocated``). A trace without kernels (a CPU run) shows the main thread's outermost ATen
  operators as the compute row and gloo's collectives (``gloo:...`` ranges on their worker
  threads) as the communication row.
- `load(path)`: a timeline `save`d by a job, clipped to its window (a few hundred kB where the
  whole trace has tens of MB).

`window_of(tl, pattern)` finds the window of the ranges a pattern names (one block's forward and
backward, one profiled step), extended to the end of the kernels launched inside it; `clip`
keeps what overlaps a window. Times are nanoseconds on the capture's own clock.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from cs336_systems.profiling.nsys import _RANGE_EVENT_TYPES, _tables, normalize_range_name
from cs336_systems.profiling.timeline import COMM

FORMAT = "cs336-timeline/1"
NSYS = "Nsight Systems"
TORCH = "torch.profiler"
RANGE_COLUMNS = ["name", "start_ns", "end_ns", "tid"]
KERNEL_COLUMNS = ["name", "start_ns", "end_ns", "launch_ns", "stream", "comm"]
MEMORY_COLUMNS = ["t_ns", "bytes"]
# the tables `read_sqlite` reads (`nsys.trim_sqlite(src, dst, TABLES)` keeps them)
TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
    "CUDA_GPU_MEMORY_USAGE_EVENTS",
)


@dataclass
class Timeline:
    """One capture's rows. `memory` is None where the capture has no memory track, and
    `memory_what` then says why; `compute_what` names what the compute row shows."""

    source: str
    ranges: pd.DataFrame
    kernels: pd.DataFrame
    memory: pd.DataFrame | None
    memory_what: str
    compute_what: str = "CUDA kernels"
    comm_what: str = "NCCL kernels"
    notes: list[str] = field(default_factory=list)
    window: tuple[float, float] | None = None  # what `clip` kept

    @property
    def compute(self) -> pd.DataFrame:
        return self.kernels[~self.kernels["comm"].astype(bool)]

    @property
    def communication(self) -> pd.DataFrame:
        return self.kernels[self.kernels["comm"].astype(bool)]


def _frame(rows, columns: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=columns)
    for c in columns:
        if c.endswith("_ns") or c in ("bytes", "stream", "tid"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


# ---- Nsight Systems' SQLite export ------------------------------------------------------------


def read_sqlite(db: str | os.PathLike) -> Timeline:
    """The timeline of an nsys SQLite export (module doc)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = _tables(con)
        kernels = _sqlite_kernels(con, tables)
        ranges = _sqlite_ranges(con, tables)
        memory, what = _sqlite_memory(con, tables)
    finally:
        con.close()
    return Timeline(NSYS, ranges, kernels, memory, what)


def _sqlite_kernels(con: sqlite3.Connection, tables: set[str]) -> pd.DataFrame:
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        return _frame([], KERNEL_COLUMNS)
    runtime = "CUPTI_ACTIVITY_KIND_RUNTIME" in tables
    join = (
        " LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId"
        " AND (r.globalTid >> 24) = (k.globalPid >> 24)"
        if runtime
        else ""
    )
    launch = "coalesce(r.start, k.start)" if runtime else "k.start"
    df = pd.read_sql_query(
        "SELECT coalesce(s.value, '') AS name, k.start AS start_ns, k.end AS end_ns,"
        f" {launch} AS launch_ns, k.streamId AS stream"
        " FROM CUPTI_ACTIVITY_KIND_KERNEL AS k LEFT JOIN StringIds AS s ON s.id = k.demangledName"
        f"{join} ORDER BY k.start",
        con,
    )
    df["comm"] = df["name"].map(lambda n: bool(COMM.search(str(n))))
    return df[KERNEL_COLUMNS]


def _sqlite_ranges(con: sqlite3.Connection, tables: set[str]) -> pd.DataFrame:
    if "NVTX_EVENTS" not in tables:
        return _frame([], RANGE_COLUMNS)
    types = ",".join(str(t) for t in _RANGE_EVENT_TYPES)
    strings = "LEFT JOIN StringIds AS s ON s.id = ne.textId" if "StringIds" in tables else ""
    text = "coalesce(ne.text, s.value, '')" if strings else "coalesce(ne.text, '')"
    df = pd.read_sql_query(
        f"SELECT {text} AS name, ne.start AS start_ns, ne.end AS end_ns,"
        f" ne.globalTid & 16777215 AS tid FROM NVTX_EVENTS AS ne {strings}"
        f" WHERE ne.eventType IN ({types}) AND ne.end IS NOT NULL ORDER BY ne.start",
        con,
    )
    df["name"] = df["name"].map(normalize_range_name)
    return df[RANGE_COLUMNS]


def _sqlite_memory(con: sqlite3.Connection, tables: set[str]) -> tuple[pd.DataFrame | None, str]:
    """Device memory in use after each cudaMalloc/cudaFree (memKind 2 and 3: device memory;
    memoryOperationType 0 allocates, 1 frees), summed from the capture's start."""
    if "CUDA_GPU_MEMORY_USAGE_EVENTS" not in tables:
        return None, "no memory track: the capture has no CUDA memory usage events"
    ev = pd.read_sql_query(
        "SELECT start AS t_ns, bytes, memoryOperationType AS op FROM CUDA_GPU_MEMORY_USAGE_EVENTS"
        " WHERE memKind IN (2, 3) AND memoryOperationType IN (0, 1) ORDER BY start",
        con,
    )
    if ev.empty:
        return None, "no memory track: no device allocation in the capture"
    signed = ev["bytes"].where(ev["op"] == 0, -ev["bytes"])
    mem = pd.DataFrame({"t_ns": ev["t_ns"], "bytes": signed.cumsum()})
    return mem, "CUDA memory reserved (cudaMalloc minus cudaFree: the caching allocator's segments)"


# ---- torch.profiler's Chrome trace ------------------------------------------------------------


def read_chrome_trace(path: str | os.PathLike) -> Timeline:
    """The timeline of a torch.profiler Chrome trace (module doc); times in ns."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    launches = {
        e["args"]["correlation"]: e["ts"] * 1e3
        for e in spans
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    kernels = [_trace_kernel(e, launches) for e in spans if e.get("cat") == "kernel"]
    ranges = [_trace_span(e) for e in spans if e.get("cat") == "user_annotation" and not _comm(e)]
    memory, what = _trace_memory(events)
    tl = Timeline(
        TORCH, _frame(ranges, RANGE_COLUMNS), _frame(kernels, KERNEL_COLUMNS), memory, what
    )
    if not kernels:
        tl = _host_rows(tl, spans)
    return tl


def _comm(e: dict) -> bool:
    return bool(COMM.search(str(e.get("name", ""))))


def _trace_span(e: dict) -> dict:
    start = e["ts"] * 1e3
    return {"name": e["name"], "start_ns": start, "end_ns": start + e["dur"] * 1e3, "tid": e["tid"]}


def _trace_kernel(e: dict, launches: dict) -> dict:
    span = _trace_span(e)
    launch = launches.get(e.get("args", {}).get("correlation"), span["start_ns"])
    stream = e.get("args", {}).get("stream", e.get("tid"))
    return {**span, "launch_ns": launch, "stream": stream, "comm": _comm(e)}


def _host_rows(tl: Timeline, spans: list[dict]) -> Timeline:
    """No kernels (a CPU run): the main thread's outermost ATen operators as compute, gloo's
    collectives (on any thread) as communication."""
    ops = [e for e in spans if e.get("cat") == "cpu_op" and str(e["name"]).startswith("aten::")]
    threads = pd.Series([e["tid"] for e in ops])
    main = threads.mode().iloc[0] if len(threads) else None
    top, end = [], -1.0
    for e in sorted((e for e in ops if e["tid"] == main), key=lambda e: e["ts"]):
        if e["ts"] >= end:  # not inside the previous outermost operator
            top.append(e)
            end = e["ts"] + e["dur"]
    comm = [e for e in spans if str(e.get("name", "")).startswith("gloo:")]
    rows = [{**_trace_span(e), "stream": 0, "comm": False} for e in top]
    rows += [{**_trace_span(e), "stream": 1, "comm": True} for e in comm]
    for r in rows:
        r["launch_ns"] = r["start_ns"]
    kernels = _frame(rows, KERNEL_COLUMNS).sort_values("start_ns", ignore_index=True)
    return replace(
        tl,
        kernels=kernels,
        compute_what="CPU operators (main thread, outermost ATen ops)",
        comm_what="gloo collectives (worker threads)",
    )


def _trace_memory(events: list[dict]) -> tuple[pd.DataFrame | None, str]:
    """The allocator's total allocated after each event: CUDA's where the trace has any, else
    the CPU's."""
    marks = [e for e in events if e.get("name") == "[memory]" and "args" in e]
    if not marks:
        return None, "no memory track: the trace was recorded without profile_memory"
    cuda = [e for e in marks if e["args"].get("Device Type") == 1]
    chosen = cuda or marks
    mem = _frame(
        [{"t_ns": e["ts"] * 1e3, "bytes": e["args"].get("Total Allocated")} for e in chosen],
        MEMORY_COLUMNS,
    ).sort_values("t_ns", ignore_index=True)
    where = "CUDA" if cuda else "CPU"
    return mem, f"{where} memory allocated (PyTorch's allocator, from torch.profiler)"


# ---- windows, clipping, the saved form ---------------------------------------------------------


def window_of(tl: Timeline, pattern: str) -> tuple[float, float] | None:
    """(start, end) ns from the first range whose name matches `pattern` (a regex, full match)
    to the last one's end, extended to the end of every kernel launched inside; None if none
    matches."""
    names = tl.ranges["name"].astype(str)
    hit = tl.ranges[names.map(lambda n: re.fullmatch(pattern, n) is not None)]
    if hit.empty:
        return None
    lo, hi = float(hit["start_ns"].min()), float(hit["end_ns"].max())
    k = tl.kernels
    inside = k[(k["launch_ns"] >= lo) & (k["launch_ns"] <= hi)]
    if len(inside):
        hi = max(hi, float(inside["end_ns"].max()))
    return lo, hi


def clip(tl: Timeline, window: tuple[float, float]) -> Timeline:
    """What overlaps `window`, and the memory in use at its start as the track's first point."""
    lo, hi = window

    def over(df: pd.DataFrame) -> pd.DataFrame:
        return df[(df["end_ns"] > lo) & (df["start_ns"] < hi)].reset_index(drop=True)

    memory = tl.memory
    if memory is not None:
        before = memory[memory["t_ns"] <= lo]
        first = pd.DataFrame(
            {"t_ns": [lo], "bytes": [before["bytes"].iloc[-1] if len(before) else 0]}
        )
        within = memory[(memory["t_ns"] > lo) & (memory["t_ns"] < hi)]
        memory = pd.concat([first, within], ignore_index=True)
    return replace(
        tl, ranges=over(tl.ranges), kernels=over(tl.kernels), memory=memory, window=(lo, hi)
    )


def save(tl: Timeline, path: str | os.PathLike) -> Path:
    """The timeline as gzipped JSON (`load` reads it back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": FORMAT,
        "source": tl.source,
        "memory_what": tl.memory_what,
        "compute_what": tl.compute_what,
        "comm_what": tl.comm_what,
        "notes": tl.notes,
        "window": tl.window,
        "ranges": tl.ranges.to_dict("list"),
        "kernels": tl.kernels.to_dict("list"),
        "memory": None if tl.memory is None else tl.memory.to_dict("list"),
    }
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path


def load(path: str | os.PathLike) -> Timeline:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a saved timeline ({FORMAT})")
    memory = doc["memory"]
    return Timeline(
        doc["source"],
        _frame(doc["ranges"], RANGE_COLUMNS),
        _frame(doc["kernels"], KERNEL_COLUMNS).astype({"comm": bool}),
        None if memory is None else _frame(memory, MEMORY_COLUMNS),
        doc["memory_what"],
        doc["compute_what"],
        doc["comm_what"],
        doc["notes"],
        tuple(doc["window"]) if doc.get("window") else None,
    )


def read(path: str | os.PathLike) -> Timeline:
    """Any of the three sources, by its name: ``.sqlite``, ``.timeline.json.gz``, else a
    Chrome trace."""
    name = Path(path).name
    if name.endswith(".sqlite"):
        return read_sqlite(path)
    if name.endswith(".timeline.json.gz"):
        return load(path)
    return read_chrome_trace(path)


def save_window(source: str | os.PathLike, pattern: str, out: str | os.PathLike) -> Path:
    """Read `source`, clip it to the window of the ranges `pattern` names (the whole capture
    where none does, said in its notes) and `save` it to `out`."""
    tl = read(source)
    window = window_of(tl, pattern)
    if window is None:
        tl.notes.append(f"no range named {pattern!r}: the whole capture")
        starts = pd.concat([tl.ranges["start_ns"], tl.kernels["start_ns"]])
        ends = pd.concat([tl.ranges["end_ns"], tl.kernels["end_ns"]])
        window = (float(starts.min()), float(ends.max())) if len(starts) else (0.0, 0.0)
    return save(clip(tl, window), out)
