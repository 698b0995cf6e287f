"""Host-time probe of our FlashAttention forward+backward (scripts/gpu/flash_overhead.sh): per
point, the wall time of the Python calls without synchronizing (what the host spends issuing
them) against the kernels' time (CUDA events around many calls), with the fast path (kept
programs, bound launches) on and off, in one process. Writes a CSV; prints a compact table.

    python3 scripts/gpu/flash_overhead.py OUT.csv
"""

from __future__ import annotations

import csv
import sys
import time

import torch

from cs336_systems.kernels import bound_launch
from cs336_systems.kernels import flash_triton as fat


def probe(d: int, n: int, fast: bool, reps: int = 30) -> dict:
    fat.set_fast_path(programs=fast, bind=fast)
    q, k, v = (
        torch.randn(1, 16, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn(1, 16, n, d, device="cuda", dtype=torch.bfloat16)

    def step():
        o = fat.FlashAttentionTriton.apply(q, k, v, True)
        o.backward(do)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    host = []
    for _ in range(reps):  # host: issue time of one call, the GPU idle before it
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):  # back to back: the host runs ahead where it is faster
        step()
    end.record()
    torch.cuda.synchronize()
    host.sort()
    return {
        "head_dim": d,
        "seq_len": n,
        "fast_path": int(fast),
        "host_ms_median": round(host[len(host) // 2], 4),
        "back_to_back_ms": round(start.elapsed_time(end) / reps, 4),
        "bind": int(fat.FAST["bind"]),
        "unbound": ";".join(f"{k}: {v}" for k, v in bound_launch.UNBOUND.items()),
    }


def main(path: str) -> None:
    rows = []
    for d in (16, 32, 64, 128):
        for n in (1024, 4096, 16384):
            for fast in (True, False):
                try:
                    rows.append(probe(d, n, fast))
                except Exception as exc:  # a failing point is a row, the probe goes on
                    rows.append({"head_dim": d, "seq_len": n, "fast_path": int(fast),
                                 "unbound": f"error: {type(exc).__name__}: {exc}"[:300]})  # fmt: skip
    fields = sorted({k for r in rows for k in r}, key=list(rows[0]).index)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        sys.stdout.write(",".join(str(r.get(k, "")) for k in fields) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
