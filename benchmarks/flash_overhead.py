"""Host-time probe of our FlashAttention forward+backward (benchmarks/flash_overhead.sh): per
point, the wall time of the Python calls without synchronizing (what the host spends issuing
them) against the kernels' time (CUDA events around many calls), with the fast path (kept
programs, bound launches) on and off, in one process; per fast point also the pieces (forward
and backward launchers called directly, the autograd Function's forward alone), the launches
per call (JIT, bound, unbound: from `bound_launch.STATS`) and SDPA cuDNN's host time for the
same call. Writes a CSV, and cProfile listings of the fast path's calls (PROFILE_DIR); prints a
compact table. `interleaved(d, n)` times ours and cuDNN's calls alternating, pair by pair.

    python3 benchmarks/flash_overhead.py OUT.csv [PROFILE_DIR]
"""

from __future__ import annotations

import cProfile
import csv
import pstats
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.core.harness import issue_ms
from cs336_systems.kernels import bound_launch
from cs336_systems.kernels import flash_triton as fat


def _host_ms(fn, reps: int) -> float:
    """Median issue time of `fn` after the GPU went idle (no sync inside the timing)."""
    return round(issue_ms(fn, reps), 4)


def call_pair(d: int, n: int):
    """(q, k, v, dO, ours, cudnn) at (1, 16, n, d) bf16 causal: leaves q, k, v requiring grad,
    and one forward+backward of ours (FlashAttentionTriton) and of SDPA cuDNN on them."""
    q, k, v = (
        torch.randn(1, 16, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    do = torch.randn(1, 16, n, d, device="cuda", dtype=torch.bfloat16)

    def ours():
        fat.FlashAttentionTriton.apply(q, k, v, True).backward(do)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    return q, k, v, do, ours, cudnn


def probe(d: int, n: int, fast: bool, reps: int = 30, profile_to: str | None = None) -> dict:
    fat.set_fast_path(programs=fast, bind=fast)
    q, k, v, do, step, cudnn = call_pair(d, n)
    qd, kd, vd = q.detach(), k.detach(), v.detach()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    before = dict(bound_launch.STATS)
    host = _host_ms(step, reps)
    per_call = {key: (bound_launch.STATS[key] - before[key]) / reps for key in before}
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):  # back to back: the host runs ahead where it is faster
        step()
    end.record()
    torch.cuda.synchronize()
    row = {
        "head_dim": d,
        "seq_len": n,
        "fast_path": int(fast),
        "host_ms_median": host,
        "back_to_back_ms": round(start.elapsed_time(end) / reps, 4),
        "bind": int(fat.FAST["bind"]),
        "jit_per_call": per_call["jit"],
        "bound_per_call": per_call["bound"],
        "unbound_per_call": per_call["unbound"],
    }
    if fast:
        o, lse = fat.flash_forward_triton(qd, kd, vd, True)
        row["host_forward_ms"] = _host_ms(lambda: fat.flash_forward_triton(qd, kd, vd, True), reps)
        row["host_backward_ms"] = _host_ms(
            lambda: fat.flash_backward_triton(qd, kd, vd, o, do, lse, True), reps
        )
        row["host_apply_ms"] = _host_ms(lambda: fat.FlashAttentionTriton.apply(q, k, v, True), reps)
        try:
            cudnn()
            row["host_cudnn_ms"] = _host_ms(cudnn, reps)
        except Exception as exc:  # no cuDNN attention here: the row says so
            row["host_cudnn_ms"] = f"error: {type(exc).__name__}"
        if profile_to:
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(reps):
                step()
            prof.disable()
            torch.cuda.synchronize()
            with open(profile_to, "w") as f:
                f.write(f"d={d} n={n}: {reps} fast forward+backward calls\n")
                pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(40)
                pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(40)
    row["unbound"] = ";".join(f"{k}: {v}" for k, v in bound_launch.UNBOUND.items())
    return row


def components(d: int, n: int, reps: int = 200) -> dict:
    """Host time (ms, median of `reps`, GPU idle before each) of the pieces of one fast
    forward+backward at (1, 16, n, d) bf16 causal: allocations, the device/stream query, the
    forward and backward programs called directly and each of their launches, the dQ cast, an
    autograd Function that only allocates (the engine's own cost), a C++ node of the same graph
    shape (`cpp_node`), and the whole call."""
    fat.set_fast_path(programs=True, bind=True)
    q, k, v, do, ours, cudnn = call_pair(d, n)
    for _ in range(3):
        ours()
    torch.cuda.synchronize()
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    fwd = next(
        p for key, p in fat._PROGRAMS.items() if key[0] == "forward" and key[2][0] == q.shape
    )
    bwd = next(iter(fwd.backward_programs.values()))
    row = {"head_dim": d, "seq_len": n}
    row["empty"] = _host_ms(lambda: torch.empty_like(qd), reps)
    row["empty_x7"] = _host_ms(lambda: [torch.empty_like(qd) for _ in range(7)], reps)
    row["device_stream"] = _host_ms(fat._device_stream, reps)
    row["fwd_program"] = _host_ms(lambda: fwd(qd, kd, vd), reps)
    o, lse = fwd(qd, kd, vd)
    gpu, stream = fat._device_stream()
    t = (qd, kd, vd, o, lse)
    row["fwd_launch"] = _host_ms(lambda: fwd.step(t, gpu, stream), reps)
    row["bwd_program"] = _host_ms(lambda: bwd(qd, kd, vd, o, do, lse), reps)
    delta = torch.empty(bwd.lse_shape, dtype=torch.float32, device="cuda")
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
    acc = torch.zeros(bwd.acc_shape, dtype=torch.float32, device="cuda") if bwd.acc else None
    tensors = (qd, kd, vd, o, bwd._do(do), do, lse, delta, dq, dk, dv, acc)
    for i, step in enumerate(bwd.steps):
        row[f"bwd_launch{i}_{step.name}"] = _host_ms(lambda s=step: s(tensors, gpu, stream), reps)
    if acc is not None:
        row["dq_copy"] = _host_ms(lambda: dq.copy_(acc), reps)

    class Noop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c):
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, g):
            return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)

    row["noop_autograd"] = _host_ms(lambda: Noop.apply(q, k, v).backward(do), reps)

    class Saves(Noop):  # the noop saving what ours saves (Q, K, V, O, L)
        @staticmethod
        def forward(ctx, a, b, c):
            o = torch.empty_like(a)
            ctx.save_for_backward(a, b, c, o, torch.empty(a.shape[:-1], device=a.device))
            return o

        @staticmethod
        def backward(ctx, g):
            _ = ctx.saved_tensors  # unpacked, as ours does
            return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)

    class Views(Noop):  # the noop returning its gradients as ours does: slices of one buffer
        @staticmethod
        def backward(ctx, g):
            return torch.empty((3, *g.shape), dtype=g.dtype, device=g.device).unbind(0)

    row["saves_autograd"] = _host_ms(lambda: Saves.apply(q, k, v).backward(do), reps)
    row["views_autograd"] = _host_ms(lambda: Views.apply(q, k, v).backward(do), reps)
    # the same graph shape through a C++ autograd node (three inputs, one output): what a
    # Python Function costs beyond a C++ one on this host (no GIL for the engine's device thread)
    row["cpp_node"] = _host_ms(lambda: torch.addcmul(q, k, v).backward(do), reps)
    row["apply_only"] = _host_ms(lambda: fat.FlashAttentionTriton.apply(q, k, v, True), reps)
    row["apply_backward"] = _host_ms(ours, reps)
    row["cudnn_backward"] = _host_ms(cudnn, reps)
    # the kernels' own time per call (torch.profiler, CUDA activity), and the host's per op
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fat.FlashAttentionTriton.apply(q, k, v, True).backward(do)
        torch.cuda.synchronize()
    row["profiler"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return row


def interleaved(d: int, n: int, reps: int = 400) -> dict:
    """Host time of one forward+backward, ours (the fast path) against SDPA cuDNN's, the two
    calls alternating pair by pair (ours first in even pairs, cuDNN's in odd ones), the GPU idle
    before each: a drift of the host's speed falls on both alike. Per point the median of each
    and the median and quartiles of the per-pair ratio ours / cuDNN."""
    import time

    fat.set_fast_path(programs=True, bind=True)
    _, _, _, _, ours, cudnn = call_pair(d, n)

    def once(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    for _ in range(5):
        ours(), cudnn()
    a, b = [], []
    for i in range(reps):
        if i % 2:
            b.append(once(cudnn))
            a.append(once(ours))
        else:
            a.append(once(ours))
            b.append(once(cudnn))
    torch.cuda.synchronize()
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return {
        "head_dim": d,
        "seq_len": n,
        "ours_ms": round(sorted(a)[reps // 2], 4),
        "cudnn_ms": round(sorted(b)[reps // 2], 4),
        "ratio_median": round(ratios[reps // 2], 3),
        "ratio_q1": round(ratios[reps // 4], 3),
        "ratio_q3": round(ratios[3 * reps // 4], 3),
    }


def _write(path: str, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)


def main(path: str, profile_dir: str | None = None) -> None:
    import json

    if profile_dir:  # the pieces first: the probe below may run out of time
        with open(f"{profile_dir}/components.jsonl", "w") as f:
            for d in (16, 32, 64, 128):
                for n in (1024, 4096):
                    try:
                        row = components(d, n)
                    except Exception as exc:
                        row = {"head_dim": d, "seq_len": n, "error": f"{type(exc).__name__}: {exc}"}
                    prof = row.pop("profiler", "")
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    sys.stdout.write(json.dumps(row) + "\n")
                    if prof:
                        with open(f"{profile_dir}/torchprof_d{d}_n{n}.txt", "w") as g:
                            g.write(prof)
    rows = []
    for d in (16, 32, 64, 128):
        for n in (1024, 4096, 16384):
            for fast in (True, False):
                profile_to = None
                if profile_dir and fast and n == 1024:
                    profile_to = f"{profile_dir}/profile_d{d}_n{n}.txt"
                try:
                    rows.append(probe(d, n, fast, profile_to=profile_to))
                except Exception as exc:  # a failing point is a row, the probe goes on
                    rows.append({"head_dim": d, "seq_len": n, "fast_path": int(fast),
                                 "unbound": f"error: {type(exc).__name__}: {exc}"[:300]})  # fmt: skip
                _write(path, rows)  # after every point: a timeout keeps what was measured
                sys.stdout.write(",".join(f"{k}={v}" for k, v in rows[-1].items()) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
