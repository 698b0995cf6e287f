"""Routings of the Gluon passes side by side (rounds 10 and 11 of the flash notes): per
variant, the gradients against a float64 reference first (causal 1000 x 1000, not causal
777 x 1031, causal 2048 x 2048; B=1, H=2, bf16), then forward+backward at B=1, H=16, causal bf16
for n = 16384, 4096 and 1024, timed as the target job times a point
(`core.harness.device_time`, gradients set to None, median) in interleaved rounds: each round
times every variant of a head dim and SDPA cuDNN once, in an order rotated by one each round, so
that a host whose clocks drift moves every variant alike. Per variant the median of its rounds,
and each round's ratio to cuDNN's time in the same round.

Variants patch the routing tables of `kernels/hopper/configs.py` in this process (then the plans
and kept programs are cleared). Sets:
- `serial` (round 10, d = 128): `routed` (as committed), `fused_s3` (the SERIAL pass with its dQ,
  three Q/dO stages and two dS buffers), `unfused_s3` (the SERIAL pass without dQ, then the dQ
  pass), `r9` (the routing before round 10: the one-warpgroup pass of 32 x 64 and the dQ pass).
- `heads` (round 11, d = 64 and 128): the routed forward and dK/dV pass with HEADS_TOGETHER
  0 (as the grid launches), 1, 2 and 4 (`hopper/common.py: program_tile`).

    python3 benchmarks/flash_routing_ab.py OUT_DIR [SET [ROUNDS]]   (default: serial, 7 rounds)
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

SERIAL = {"WS": True, "SERIAL": True}
ROUTED = {name: dict(table) for name, table in hc.CONFIGS.items()}


def together(d: int, g: int) -> dict:
    """The routed forward and dK/dV configs of head dim d with HEADS_TOGETHER = g."""
    out = {}
    for name in ("forward", "backward_dkdv"):
        config = ROUTED[name][d]
        out[name] = (*config[:4], {**(config[4] if len(config) > 4 else {}), "HEADS_TOGETHER": g})
    return out


# set -> head dim -> variant -> {table: config} (the tables' other entries as committed)
SETS = {
    "serial": {
        128: {
            "routed": {},
            "fused_s3": {
                "backward_dkdv": (64, 128, 4, 3, {**SERIAL, "FUSE_DQ": True, "DS_BUFS": 2})
            },
            "unfused_s3": {"backward_dkdv": (64, 128, 4, 3, SERIAL)},
            "r9": {"backward_dkdv": (32, 64, 4, 3)},
        }
    },
    "heads": {d: {f"together_{g}": together(d, g) for g in (0, 1, 2, 4)} for d in (64, 128)},
}
CHECKS = ((True, 1000, 1000), (False, 777, 1031), (True, 2048, 2048))


def route(d: int, patch: dict) -> None:
    for name, table in hc.CONFIGS.items():
        table.clear()
        table.update(ROUTED[name])
        if name in patch:
            table[d] = patch[name]
    dispatch._CACHE.clear()
    fat.clear_programs()


def largest_error(d: int, causal: bool, n_q: int, n_k: int) -> float:
    """The largest relative error (Frobenius) of O, dQ, dK, dV against float64."""
    g = torch.Generator(device="cuda").manual_seed(n_q)
    shape = {"q": n_q, "k": n_k, "v": n_k, "do": n_q}
    x = {
        name: torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for name, n in shape.items()
    }
    q, k, v = (x[name].requires_grad_() for name in "qkv")
    o = fat.FlashAttentionTriton.apply(q, k, v, causal)
    o.backward(x["do"])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) / d**0.5
    if causal:
        rows = torch.arange(n_q, device="cuda")[:, None]
        s = s.masked_fill(rows < torch.arange(n_k, device="cuda")[None], float("-inf"))
    o64 = torch.softmax(s, -1) @ v64
    o64.backward(x["do"].double())
    pairs = [(o, o64), *((a.grad, b.grad) for a, b in zip((q, k, v), (q64, k64, v64), strict=True))]
    return max(float((a.double() - b).norm() / b.norm()) for a, b in pairs)


def time_length(d: int, variants: dict, n: int, rounds: int) -> list[dict]:
    """Every variant and cuDNN at head dim d and length n, in `rounds` interleaved rounds: one
    row each."""
    q, k, v, _, ours, cudnn = call_pair(d, n)
    names = [*variants, "cudnn"]
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name != "cudnn":
                route(d, variants[name])
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
        rows.append({"d": d, "variant": name, "n": n, "median_ms": median, "rounds_ms": ts})
        rows[-1]["round_ratios"] = [
            round(a / b, 4) for a, b in zip(ts, times["cudnn"], strict=True)
        ]
        rows[-1]["ratio"] = round(median / sorted(times["cudnn"])[len(ts) // 2], 4)
    return rows


def main(out: str, which: str, rounds_long: int) -> None:
    rows = []
    for d, variants in SETS[which].items():
        for name, patch in variants.items():
            route(d, patch)
            error = max(largest_error(d, *shape) for shape in CHECKS)
            rows.append({"d": d, "variant": name, "config": repr(patch), "largest_error": error})
            print(json.dumps(rows[-1]), flush=True)
        for n in (16384, 4096, 1024):
            for row in time_length(d, variants, n, rounds_long if n == 16384 else 3):
                rows.append(row)
                print(json.dumps(row), flush=True)
    route(0, {})
    with open(f"{out}/flash_routing_ab_{which}.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1] if len(args) > 1 else "serial", int(args[2]) if len(args) > 2 else 7)
