"""The fixed-cost target set under different routings: per routing variant, head dim
and length, our forward+backward and SDPA cuDNN's timed as the flash stage's target job times
them (`core.harness.device_time`, do_bench 25/100 ms, median, p20, p80), in ROUNDS alternating
rounds so both see the same host; the host's issue time of one call with the GPU idle before it
(`issue_ms`); launches per call (JIT / bound / unbound); the largest error against SDPA (math).
Variants (routing tables patched in this process, then the plans and kept programs cleared):
`routed` (hopper/configs.py as committed), `gluon` (every pass on the Gluon kernels at d = 16 and
32: their default forward and the warp-specialized dQ pass), `d64_two_pass` (d = 64 without
FUSE_DQ: the warp-specialized dQ pass, then the warp-specialized dK/dV pass). Also torch.profiler
tables (self CPU time) of 20 calls per head dim at n = 1024, routed.

    python3 benchmarks/flash_target_probe.py OUT_DIR [VARIANT ...]   (default: all three)
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from flash_overhead import call_pair  # this folder (benchmarks/) is the script's sys.path[0]
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.core.harness import device_time, issue_ms
from cs336_systems.kernels import bound_launch, dispatch
from cs336_systems.kernels import flash_triton as fat
from cs336_systems.kernels.hopper import configs as hc

ROUNDS = 3
QUANTILES = (0.5, 0.2, 0.8)
ROUTED = {name: dict(table) for name, table in hc.CONFIGS.items()}


def route(variant: str) -> None:
    for name, table in hc.CONFIGS.items():
        table.clear()
        table.update(ROUTED[name])
    if variant == "gluon":
        for d in (16, 32):
            hc.FORWARD_CONFIGS[d] = hc.DEFAULT_CONFIGS["forward"]
            hc.DQ_CONFIGS[d] = hc.DEFAULT_CONFIGS["backward_dq"]
    elif variant == "d64_two_pass":
        hc.DKDV_CONFIGS[64] = (64, 128, 4, 3, {"WS": True, "A_IN_REGS": True})
    dispatch._CACHE.clear()
    fat.clear_programs()


def point(variant: str, d: int, n: int) -> dict:
    q, k, v, _, ours, cudnn = call_pair(d, n)
    row: dict = {"variant": variant, "d": d, "n": n}
    with torch.no_grad():
        o = fat.FlashAttentionTriton.apply(q, k, v, True)
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        row["max_err_o"] = float((o.float() - ref).abs().max())
    for fn in (ours, cudnn):
        fn()
    torch.cuda.synchronize()
    row["configs"] = json.dumps(
        {
            k: f"{c.get('BLOCK_Q')}x{c.get('BLOCK_K')} {c.get('kernel')}"
            for k, c in fat.chosen_configs().items()
        }  # fmt: skip
    )
    before = dict(bound_launch.STATS)
    row["ours_issue_ms"] = round(issue_ms(ours, 100), 4)
    row.update({f"{k}_per_call": (bound_launch.STATS[k] - before[k]) / 100 for k in before})
    row["cudnn_issue_ms"] = round(issue_ms(cudnn, 100), 4)
    for r in range(ROUNDS):
        for name, fn in (("ours", ours), ("cudnn", cudnn)):
            t = device_time(fn, "cuda", "x", warmup_ms=25, rep_ms=100, quantiles=QUANTILES,
                            grad_to_none=[q, k, v])  # fmt: skip
            row[f"{name}_r{r}"] = round(t["x_ms_median"], 4)
            row[f"{name}_r{r}_p20_p80"] = f"{t['x_ms_p20']:.4f}/{t['x_ms_p80']:.4f}"
    med = {
        name: sorted(row[f"{name}_r{r}"] for r in range(ROUNDS))[ROUNDS // 2]
        for name in ("ours", "cudnn")
    }
    row["ours_ms"], row["cudnn_ms"] = med["ours"], med["cudnn"]
    row["ratio"] = round(med["ours"] / med["cudnn"], 3)
    return row


def main(out: str, only: list[str]) -> None:
    variants = {"routed": (16, 32, 64, 128), "gluon": (16, 32), "d64_two_pass": (64,)}
    variants = {name: dims for name, dims in variants.items() if not only or name in only}
    with open(f"{out}/target_probe.jsonl", "w") as f:
        for variant, dims in variants.items():
            route(variant)
            for d in dims:
                for n in (1024, 4096, 16384):
                    try:
                        row = point(variant, d, n)
                    except Exception as exc:  # a failing point is a row; the probe goes on
                        row = {"variant": variant, "d": d, "n": n,
                               "error": f"{type(exc).__name__}: {exc}"[:400]}  # fmt: skip
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    keys = ("variant", "d", "n", "ours_ms", "cudnn_ms", "ratio", "ours_issue_ms",
                            "cudnn_issue_ms", "jit_per_call", "unbound_per_call", "error")  # fmt: skip
                    print(" ".join(f"{k}={row[k]}" for k in keys if k in row), flush=True)
    route("routed")
    from torch.profiler import ProfilerActivity, profile

    for d in (16, 64, 128):
        q, k, v = (
            torch.randn(1, 16, 1024, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        do = torch.randn(1, 16, 1024, d, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            fat.FlashAttentionTriton.apply(q, k, v, True).backward(do)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fat.FlashAttentionTriton.apply(q, k, v, True).backward(do)
            torch.cuda.synchronize()
        with open(f"{out}/torchprof_d{d}.txt", "w") as g:
            g.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    print("unbound:", bound_launch.UNBOUND)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
