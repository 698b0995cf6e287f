"""Host time of our FlashAttention forward+backward on a CPU machine: the fake sm90 driver
(`kernels.fake_sm90`: kernels compiled for an H100, launches recorded, nothing run) stands in for
the GPU, so what is timed is the Python of a call (autograd, keys, allocations, steps) without the
driver's C launch and TMA encoding. Fake-driver numbers on this CPU, not GPU numbers.

    TRITON_INTERPRET=0 python scripts/flash_host_time.py [--profile] [--reps N] [D:N ...]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import torch

from cs336_systems.kernels import fake_sm90

fake_sm90.install()
fake_sm90.RECORD = False

from cs336_systems.kernels import bound_launch  # noqa: E402
from cs336_systems.kernels import flash_triton as fat  # noqa: E402


def point(d: int, n: int, fast: bool, reps: int, profile: bool) -> dict:
    fat.set_fast_path(programs=fast, bind=fast)
    q, k, v = (torch.randn(1, 16, n, d, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    do = torch.randn(1, 16, n, d, dtype=torch.bfloat16)

    def step():  # gradients set to None first (zero_grad's default): no CPU additions timed
        q.grad = k.grad = v.grad = None
        o = fat.FlashAttentionTriton.apply(q, k, v, True)
        o.backward(do)

    for _ in range(3):
        step()
    before = dict(bound_launch.STATS)
    times = []
    prof = cProfile.Profile() if profile else None
    for _ in range(reps):
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        step()
        if prof:
            prof.disable()
        times.append((time.perf_counter() - t0) * 1e3)
    stats = {key: bound_launch.STATS[key] - before[key] for key in before}
    if prof:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    times.sort()
    return {
        "head_dim": d,
        "seq_len": n,
        "fast": int(fast),
        "host_ms_median": round(times[len(times) // 2], 4),
        "host_ms_min": round(times[0], 4),
        "per_call_stats": {key: v / reps for key, v in stats.items()},
        "unbound": dict(bound_launch.UNBOUND),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("points", nargs="*", default=["16:1024", "64:1024", "128:1024"])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--plain", action="store_true", help="also time the plain path")
    args = parser.parse_args()
    for spec in args.points:
        d, n = map(int, spec.split(":"))
        for fast in (True, False) if args.plain else (True,):
            sys.stdout.write(f"{point(d, n, fast, args.reps, args.profile)}\n")


if __name__ == "__main__":
    main()
