"""Small torch.profiler-like Chrome traces, one per rank, with kernels on GPU streams where the
test says: what HolisticTraceAnalysis and profiling/trace_breakdown.py read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_trace(path: Path, rank: int, kernels, step=None, host=()) -> Path:
    """`kernels`: (name, start_us, duration_us, stream) launched from one CPU operator each;
    `step`: the profiled step's host range (start_us, duration_us); `host`: further host
    events (name, start_us, duration_us), gloo's collectives for instance."""
    events = []
    for i, (name, ts, dur, stream) in enumerate(kernels):
        corr = {"correlation": 100 + i, "External id": 100 + i}
        events.append(dict(ph="X", cat="cpu_op", name="aten::mm", pid=1, tid=1, ts=ts - 6,
                           dur=4, args={"External id": 100 + i}))  # fmt: skip
        events.append(dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=1, tid=1,
                           ts=ts - 5, dur=2, args=corr))  # fmt: skip
        events.append(dict(ph="X", cat="kernel", name=name, pid=0, tid=stream, ts=ts, dur=dur,
                           args={**corr, "stream": stream, "device": 0}))  # fmt: skip
    if step is not None:
        events.append(dict(ph="X", cat="user_annotation", name="profiled_step", pid=1, tid=1,
                           ts=step[0], dur=step[1], args={}))  # fmt: skip
    for name, ts, dur in host:
        events.append(dict(ph="X", cat="cpu_op", name=name, pid=1, tid=2, ts=ts, dur=dur, args={}))
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
        "traceEvents": events,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return path
