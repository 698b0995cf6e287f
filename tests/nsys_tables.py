"""Synthetic captures in the formats the timeline reader takes (profiling/nsys_timeline.py):
an nsys SQLite export with the schema's tables and columns it reads (kernels on a compute and
an NCCL stream, their launching runtime calls, NVTX ranges, CUDA memory usage events), and a
torch.profiler Chrome trace of a GPU step. Times in ns (SQLite) and us (trace)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

PID = 7 << 24  # globalPid: the process id above bit 24
TID = PID | 11  # globalTid of the main thread (tid 11)
COMPUTE_STREAM, NCCL_STREAM = 7, 13

# (name, start, end, stream, launch): two GEMMs and an elementwise kernel on the compute stream,
# two all-reduces on the NCCL stream, one launched inside "block.backward" ending after it
KERNELS = [
    ("void at::native::gemm_kernel<float, 128>(int, float*)", 1_000, 41_000, COMPUTE_STREAM, 900),
    ("void at::native::elementwise_kernel<4>(int)", 42_000, 46_000, COMPUTE_STREAM, 1_500),
    (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        50_000,
        70_000,
        NCCL_STREAM,
        49_000,
    ),
    (
        "void at::native::gemm_kernel<float, 128>(int, float*)",
        52_000,
        90_000,
        COMPUTE_STREAM,
        51_000,
    ),
    (
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        91_000,
        130_000,
        NCCL_STREAM,
        95_000,
    ),
]
# (text, start, end): the block's forward and backward, and a range before them
RANGES = [("warmup", 0, 800), ("block.forward", 850, 47_000), ("block.backward", 48_000, 100_000)]
# (start, bytes, memoryOperationType 0 alloc / 1 free, memKind 2 device)
MEMORY = [(500, 100 * 2**20, 0), (30_000, 50 * 2**20, 0), (95_000, 100 * 2**20, 1)]


def write_nsys_sqlite(path: Path, memory: bool = True) -> Path:
    """An nsys export's tables (only the columns the reader uses, named as nsys names them)."""
    con = sqlite3.connect(str(path))
    con.executescript(
        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT,"
        " streamId INT, correlationId INT, globalPid INT, demangledName INT, shortName INT);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT,"
        " correlationId INT, nameId INT);"
        "CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, text TEXT,"
        " globalTid INT, textId INT);"
    )
    names = {n: i for i, n in enumerate(sorted({k[0] for k in KERNELS}), start=1)}
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, n) for n, i in names.items()])
    for corr, (name, start, end, stream, launch) in enumerate(KERNELS, start=100):
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, ?, ?, ?)",
            (start, end, stream, corr, PID, names[name], names[name]),
        )
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 0)",
            (launch, launch + 5, TID, corr),
        )
    con.executemany(
        "INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL)",
        [(a, b, text, TID) for text, a, b in RANGES],
    )
    if memory:
        con.execute(
            "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INT, globalPid INT, deviceId INT,"
            " contextId INT, address INT, bytes INT, memKind INT, memoryOperationType INT)"
        )
        con.executemany(
            "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, ?, 0, 1, ?, ?, 2, ?)",
            [(t, PID, 4096 * i, b, op) for i, (t, b, op) in enumerate(MEMORY)],
        )
    con.commit()
    con.close()
    return path


def write_gpu_trace(path: Path) -> Path:
    """A torch.profiler Chrome trace of the same capture: kernels with their stream and
    correlation, the runtime calls that launched them, record_function ranges, [memory]."""
    events = []
    for corr, (name, start, end, stream, launch) in enumerate(KERNELS, start=100):
        args = {"correlation": corr, "stream": stream, "device": 0}
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": start / 1e3,
                "dur": (end - start) / 1e3,
                "args": args,
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 11,
                "ts": launch / 1e3,
                "dur": 0.005,
                "args": {"correlation": corr},
            }
        )
    for text, a, b in RANGES:
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": text,
                "pid": 1,
                "tid": 11,
                "ts": a / 1e3,
                "dur": (b - a) / 1e3,
                "args": {},
            }
        )
    total = 0
    for t, b, op in MEMORY:
        total += b if op == 0 else -b
        events.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 11,
                "ts": t / 1e3,
                "args": {
                    "Device Type": 1,
                    "Device Id": 0,
                    "Total Allocated": total,
                    "Bytes": b if op == 0 else -b,
                },
            }
        )
    path.write_text(json.dumps({"traceEvents": events}))
    return path
