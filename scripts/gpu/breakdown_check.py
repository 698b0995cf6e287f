"""Checks the leaderboard's profiled-step breakdown on a GPU (stages/leaderboard/measure.py:
timed_paths): a toy step with a matmul, our FlashAttention, the fused cross-entropy and AdamW;
prints each part's ms, the sum against the profile's total kernel time (each kernel once), and
the kernels that fell in `other`.

    python3 scripts/gpu/breakdown_check.py   (on a CUDA host, from the project root)
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from cs336_systems.engine.budget import breakdown, classify
from cs336_systems.engine.fused_ce import linear_cross_entropy
from cs336_systems.kernels.flash_triton import flash_attention
from cs336_systems.stages.leaderboard.measure import timed_paths


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    w1 = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
    head = torch.randn(32000, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
    opt = torch.optim.AdamW([w1, head], fused=True)
    x = torch.randn(4096, 1024, device=dev, dtype=torch.bfloat16)
    targets = torch.randint(0, 32000, (4096,), device=dev)

    def step():
        h = x @ w1
        q = h.view(1, 4096, 16, 64).transpose(1, 2)
        a = flash_attention(q, q, q, True).transpose(1, 2).reshape(4096, 1024)
        linear_cross_entropy(a, head, targets).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    paths = timed_paths(prof.events(), dev)
    parts = breakdown(paths)
    kernels = sum(e.self_device_time_total for e in prof.key_averages()
                  if str(e.device_type).endswith("CUDA")) / 1e3  # fmt: skip
    print({k: round(v, 3) for k, v in parts.items()})
    print(f"sum of parts {sum(parts.values()):.3f} ms; kernels in the profile {kernels:.3f} ms")
    other = sorted({p.rsplit(" / ", 1)[-1][:80] for p, _ in paths if classify(p) == "other"})
    print("other:", other[:15])


if __name__ == "__main__":
    main()
