"""The d = 128 backward's routings side by side (issue 34, round 10 of the flash notes): per
variant, the gradients against a float64 reference first (causal 1000 x 1000, not causal
777 x 1031, causal 2048 x 2048; B=1, H=2, bf16), then forward+backward at B=1, H=16, causal
bf16 for n = 16384, 4096 and 1024, timed as the target job times a point
(`core.harness.device_time`, gradients set to None, median) in interleaved rounds: each round
times every variant and SDPA cuDNN once, in an order rotated by one each round, so that a host
whose clocks drift moves every variant alike. Per variant the median of its rounds, and each
round's ratio to cuDNN's time in the same round.

Variants (the routing tables of `kernels/hopper/configs.py` patched in this process, then the
plans and kept programs cleared): `routed` (as committed), `fused_s3` (the SERIAL pass with its
dQ, three Q/dO stages and two dS buffers), `unfused_s3` (the SERIAL pass without dQ, then the
dQ pass), `r9` (the routing before round 10: the one-warpgroup pass of 32 x 64 and the dQ pass).

    python3 benchmarks/flash_d128_ab.py OUT_DIR [ROUNDS]   (default 7 rounds at n = 16384)
"""

from __future__ import annotations

import json
import sys

import torch
from flash_overhead import call_pair  # this folder (benchmarks/) is the script's sys.path[0]

from cs336_systems.core.harness import device_time
from cs336_systems.kernels import dispatch
from cs336_systems.kernels import flash_triton as fat
from cs336_systems.kernels.hopper import configs as hc

D = 128
SERIAL = {"WS": True, "SERIAL": True}
ROUTED = (hc.DKDV_CONFIGS[D], hc.DQ_CONFIGS[D])
VARIANTS = {
    "routed": ROUTED,
    "fused_s3": ((64, 128, 4, 3, {**SERIAL, "FUSE_DQ": True, "DS_BUFS": 2}), hc.DQ_CONFIGS[D]),
    "unfused_s3": ((64, 128, 4, 3, SERIAL), hc.DQ_CONFIGS[D]),
    "r9": ((32, 64, 4, 3), hc.DQ_CONFIGS[D]),
}
CHECKS = ((True, 1000, 1000), (False, 777, 1031), (True, 2048, 2048))


def route(variant: str) -> None:
    hc.DKDV_CONFIGS[D], hc.DQ_CONFIGS[D] = VARIANTS[variant]
    dispatch._CACHE.clear()
    fat.clear_programs()


def largest_error(causal: bool, n_q: int, n_k: int) -> float:
    """The largest relative error (Frobenius) of dQ, dK, dV against float64."""
    g = torch.Generator(device="cuda").manual_seed(n_q)
    shape = {"q": n_q, "k": n_k, "v": n_k, "do": n_q}
    x = {
        name: torch.randn(1, 2, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
        for name, n in shape.items()
    }
    q, k, v = (x[name].requires_grad_() for name in "qkv")
    fat.FlashAttentionTriton.apply(q, k, v, causal).backward(x["do"])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) / D**0.5
    if causal:
        rows = torch.arange(n_q, device="cuda")[:, None]
        s = s.masked_fill(rows < torch.arange(n_k, device="cuda")[None], float("-inf"))
    (torch.softmax(s, -1) @ v64).backward(x["do"].double())
    pairs = zip((q, k, v), (q64, k64, v64), strict=True)
    return max(float((a.grad - b.grad).norm() / b.grad.norm()) for a, b in pairs)


def time_length(n: int, rounds: int) -> list[dict]:
    """Every variant and cuDNN at length n, in `rounds` interleaved rounds: one row each."""
    q, k, v, _, ours, cudnn = call_pair(D, n)
    names = [*VARIANTS, "cudnn"]
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name != "cudnn":
                route(name)
                ours()  # the kept program and the backward's graph, outside the timing
            t = device_time(
                cudnn if name == "cudnn" else ours,
                "cuda",
                "x",
                warmup_ms=100,
                rep_ms=400 if n == 16384 else 100,
                quantiles=(0.5, 0.2, 0.8),
                grad_to_none=[q, k, v],
            )
            times[name].append(round(t["x_ms_median"], 4))
    rows = []
    for name in names:
        ts = times[name]
        median = sorted(ts)[len(ts) // 2]
        rows.append({"variant": name, "n": n, "median_ms": median, "rounds_ms": ts})
        rows[-1]["round_ratios"] = [
            round(a / b, 4) for a, b in zip(ts, times["cudnn"], strict=True)
        ]
        rows[-1]["ratio"] = round(median / sorted(times["cudnn"])[len(ts) // 2], 4)
    return rows


def main(out: str, rounds_long: int) -> None:
    rows = []
    for name in VARIANTS:
        route(name)
        error = max(largest_error(*shape) for shape in CHECKS)
        rows.append({"variant": name, "config": repr(VARIANTS[name]), "largest_error": error})
        print(json.dumps(rows[-1]), flush=True)
    for n in (16384, 4096, 1024):
        for row in time_length(n, rounds_long if n == 16384 else 3):
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(f"{out}/flash_d128_ab.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7)
