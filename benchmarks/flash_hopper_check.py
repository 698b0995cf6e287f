"""GPU check of the Gluon (Hopper) FlashAttention kernels: correctness on odd shapes first, then
timings of candidate tiles beside cuDNN, SDPA flash and the Triton-language kernels in the same
process. Writes rows to OUT/hopper.jsonl and prints a short table.

    python3 benchmarks/flash_hopper_check.py --out $OUT [--part check|bench|all] \
        [--configs "128:128,128,4,2,{'WS': True}" ...] [--dkdv-configs "64:64,64,4,3" ...] \
        [--dq-configs "64:128,64,8,3" ...]

A config is BLOCK_M,BLOCK_N,WARPS,STAGES with an optional dict of kernel switches, optionally
prefixed by "D:" to use it at head dim D only; each is checked against the references of every
shape in the check part and timed in the bench part.

Each part runs in a child process with a time limit, so a deadlocked kernel (a wrong mbarrier
phase) costs its limit, not the whole session.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


# the two-pass Triton-language backward's best tiles in the H100 tuning grid (notes)
BWD = {
    d: {
        "backward_dkdv": dict(zip(("BLOCK_Q", "BLOCK_K", "num_warps", "num_stages"), kv)),
        "backward_dq": dict(zip(("BLOCK_Q", "BLOCK_K", "num_warps", "num_stages"), dq)),
    }
    for d, kv, dq in (
        (64, (32, 128, 8, 2), (128, 64, 8, 3)),
        (128, (64, 128, 8, 3), (64, 32, 4, 4)),
    )
}


def parse_config(text: str) -> tuple[int | None, tuple]:
    """'[D:]BLOCK_M,BLOCK_N,WARPS,STAGES[,{switches}]' -> (head dim or None for all, config)."""
    import ast

    head, sep, rest = text.partition(":")
    dim, body = (head, rest) if sep and "," not in head else ("", text)
    return (int(dim) if dim else None), tuple(ast.literal_eval(f"({body},)"))


def configs_for(texts: list[str], d: int) -> list[tuple]:
    return [cfg for dim, cfg in map(parse_config, texts) if dim in (None, d)]


def emit(out: Path, row: dict) -> None:
    print(json.dumps(row), flush=True)
    with open(out / "hopper.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def reference(q, k, v, causal):
    """fp32 attention with top-left causal masking, chunked over queries."""
    import torch

    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    outs, lses = [], []
    for i in range(0, n_q, 1024):
        s = (q[..., i : i + 1024, :].float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
        if causal:
            rows = torch.arange(i, min(i + 1024, n_q), device=q.device)[:, None]
            s = s.masked_fill(rows < torch.arange(n_k, device=q.device)[None, :], float("-inf"))
        lses.append(torch.logsumexp(s, -1))
        outs.append(torch.softmax(s, -1) @ v.float())
    return torch.cat(outs, -2), torch.cat(lses, -1)


def reference_grads(q, k, v, do, causal):
    """dQ, dK, dV of fp32 attention (top-left causal) by autograd."""
    import torch

    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    s = (qf @ kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        keep = torch.arange(n_q, device=q.device)[:, None] >= torch.arange(n_k, device=q.device)
        s = s.masked_fill(~keep, float("-inf"))
    (torch.softmax(s, -1) @ vf).backward(do.float())
    return qf.grad, kf.grad, vf.grad


def _random(b, h, n, d, dtype, layout):
    """(b, h, n, d) random values, contiguous or as a (b, n, h, d) tensor's transposed view."""
    import torch

    if layout == "bhnd":
        return torch.randn(b, h, n, d, device="cuda", dtype=dtype)
    return torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)


def grad_err(got, ref) -> float:
    """Relative error of a gradient, absolute where the true gradient is ~0 (n = 1)."""
    return ((got.float() - ref).norm() / ref.norm().clamp_min(1.0)).item()


def check(out: Path, args) -> None:
    import torch

    from cs336_systems.kernels import flash_triton as fat
    from cs336_systems.kernels.hopper import launch as fh
    from cs336_systems.kernels.hopper.configs import fuses_dq

    torch.manual_seed(0)
    shapes = [  # (b, h, n_q, n_k, d): one tile, ragged, n_q != n_k both ways, every head dim
        (1, 2, 128, 128, 64),
        (2, 3, 1000, 1000, 64),
        (1, 2, 777, 1500, 128),
        (1, 2, 1500, 300, 32),
        (2, 2, 2048, 2048, 16),
        (1, 4, 4096, 4096, 128),
        (1, 1, 1, 1, 64),
        (1, 2, 200, 64, 128),
    ]
    cases = [(torch.bfloat16, shape) for shape in shapes] + [(torch.float16, shapes[1])]
    for dtype, (b, h, n_q, n_k, d) in cases:
        for causal in (False, True):
            for layout in ("bhnd", "bnhd"):
                q, k, v = (_random(b, h, n, d, dtype, layout) for n in (n_q, n_k, n_k))
                row = dict(
                    part="check",
                    kernel="forward",
                    dtype=str(dtype)[6:],
                    shape=[b, h, n_q, n_k, d],
                    causal=causal,
                    layout=layout,
                )
                if not fh.supported(q, k, v):
                    emit(out, {**row, "status": "unsupported"})
                    continue
                try:
                    o, lse = fh.forward(q, k, v, causal)
                    torch.cuda.synchronize()
                    o_ref, lse_ref = reference(q, k, v, causal)
                    err_o = ((o.float() - o_ref).norm() / o_ref.norm()).item()
                    err_l = (lse - lse_ref).abs().max().item()
                    ok = err_o < 2e-2 and err_l < 1e-2 and torch.isfinite(o).all().item()
                    do = torch.randn_like(o)
                    grads = fat.flash_backward_triton(q, k, v, o, do, lse, causal)
                    torch.cuda.synchronize()
                    used = fat.chosen_configs()["backward_dkdv"].get("kernel", "tl")
                    used_dq = fat.chosen_configs()["backward_dq"].get("kernel", "tl")
                    ref = reference_grads(q, k, v, do, causal)
                    errs = [grad_err(g, r) for g, r in zip(grads, ref, strict=True)]
                    row.update(
                        err_dq=errs[0], err_dk=errs[1], err_dv=errs[2], dkdv=used, dq=used_dq
                    )
                    ok = ok and all(e < 3e-2 for e in errs)
                    emit(
                        out,
                        {
                            **row,
                            "err_o": err_o,
                            "err_lse": err_l,
                            "status": "ok" if ok else "WRONG",
                        },
                    )
                    # candidate tiles and variants, each against the same references
                    for cfg in configs_for(args.configs, d):
                        o2, lse2 = fh.forward(q, k, v, causal, config=cfg)
                        torch.cuda.synchronize()
                        e_o = ((o2.float() - o_ref).norm() / o_ref.norm()).item()
                        e_l = (lse2 - lse_ref).abs().max().item()
                        good = e_o < 2e-2 and e_l < 1e-2
                        emit(
                            out,
                            {
                                **row,
                                "config": repr(cfg),
                                "err_o": e_o,
                                "err_lse": e_l,
                                "status": "ok" if good else "WRONG",
                            },
                        )
                    delta = (o.float() * do.float()).sum(-1).contiguous()
                    for cfg in configs_for(args.dkdv_configs, d):
                        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
                        fh.backward_dkdv(q, k, v, do, lse, delta, dk, dv, causal, config=cfg, dq=dq)
                        torch.cuda.synchronize()
                        pairs = {"dk": (dk, ref[1]), "dv": (dv, ref[2])}
                        if fuses_dq(d, cfg):
                            pairs["dq"] = (dq, ref[0])
                        errs = {f"err_{name}": grad_err(g, r) for name, (g, r) in pairs.items()}
                        good = all(e < 3e-2 for e in errs.values())
                        emit(
                            out,
                            {
                                **row,
                                "kernel": "backward_dkdv",
                                "config": repr(cfg),
                                **errs,
                                "status": "ok" if good else "WRONG",
                            },
                        )
                    for cfg in configs_for(args.dq_configs, d):
                        dq = torch.full_like(q, float("nan"))
                        fh.backward_dq(q, k, v, do, lse, delta, dq, causal, config=cfg)
                        torch.cuda.synchronize()
                        e = grad_err(dq, ref[0])
                        emit(
                            out,
                            {
                                **row,
                                "kernel": "backward_dq",
                                "config": repr(cfg),
                                "err_dq": e,
                                "status": "ok" if e < 3e-2 else "WRONG",
                            },
                        )
                except Exception as exc:
                    emit(out, {**row, "status": f"error: {type(exc).__name__}: {str(exc)[:300]}"})


def bench(out: Path, args) -> None:

    for d in args.head_dims:
        bench_head_dim(out, args, d)


def bench_head_dim(out: Path, args, d: int) -> None:
    import torch
    import triton.testing

    from cs336_systems.core.costs import attention_flops
    from cs336_systems.kernels import flash_triton as fat
    from cs336_systems.kernels.hopper import launch as fh
    from cs336_systems.kernels.hopper.configs import fuses_dq
    from cs336_systems.stages.flash.measure import _sdpa

    b, h, n = 1, 16, args.seq_len
    g = torch.Generator(device="cuda").manual_seed(d)
    q, k, v, do = (
        torch.randn((b, h, n, d), generator=g, device="cuda", dtype=torch.bfloat16)
        for _ in range(4)
    )
    flop_f = attention_flops(b, h, n, n, d, causal=True, pass_="forward")
    flop_b = attention_flops(b, h, n, n, d, causal=True, pass_="backward")

    def measure(impl, fn, config="", flop=None, error=None, **extra):
        """Run once; if `error()` (relative error against a reference) is 2e-2 or more the row
        says WRONG; else time with do_bench. A failure is a row, not a stop."""
        row = dict(part="bench", d=d, impl=impl, config=config, **extra)
        try:
            fn()
            if error is not None:
                row["err"] = error()
                if not row["err"] < 2e-2:
                    emit(out, {**row, "status": f"WRONG {row['err']}"})
                    return
            ms = triton.testing.do_bench(fn, warmup=25, rep=args.rep_ms, return_mode="median")
            row["ms"] = ms
            if flop:
                row["tflops"] = flop / ms / 1e9
            emit(out, row)
        except Exception as exc:
            emit(out, {**row, "status": f"error: {type(exc).__name__}: {str(exc)[:200]}"})

    def rel(a, r):
        return ((a.float() - r.float()).norm() / r.float().norm()).item()

    for name in ("sdpa_cudnn", "sdpa_flash"):
        sdpa = _sdpa(name)
        measure(name, lambda sdpa=sdpa: sdpa(q, k, v), flop=flop_f)
    measure(
        "triton_tl",
        lambda: fat.flash_forward_triton(q, k, v, True, use_gluon=False),
        flop=flop_f,
    )
    o_ref, _ = reference(q[:, :2], k[:, :2], v[:, :2], True)
    for cfg in configs_for(args.configs, d):
        measure(
            "gluon",
            lambda cfg=cfg: fh.forward(q, k, v, True, config=cfg),
            repr(cfg),
            flop_f,
            lambda cfg=cfg: rel(
                fh.forward(q[:, :2], k[:, :2], v[:, :2], True, config=cfg)[0], o_ref
            ),
        )
    # the dK/dV pass alone: Gluon tiles against the Triton-language pass's dK, dV
    o, lse = fat.flash_forward_triton(q, k, v, True)
    delta = (o.float() * do.float()).sum(-1).contiguous()
    tl_blocks = BWD.get(d, BWD[64])
    dq_ref, dk_ref, dv_ref = fat.flash_backward_triton(q, k, v, o, do, lse, True, blocks=tl_blocks)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for cfg in configs_for(args.dkdv_configs, d):
        fused = fuses_dq(d, cfg)
        measure(
            "gluon_dkdv+dq" if fused else "gluon_dkdv",
            lambda cfg=cfg: fh.backward_dkdv(
                q, k, v, do, lse, delta, dk, dv, True, config=cfg, dq=dq
            ),
            repr(cfg),
            error=lambda fused=fused: max(
                rel(dk, dk_ref), rel(dv, dv_ref), rel(dq, dq_ref) if fused else 0.0
            ),
        )
    for cfg in configs_for(args.dq_configs, d):
        measure(
            "gluon_dq",
            lambda cfg=cfg: fh.backward_dq(q, k, v, do, lse, delta, dq, True, config=cfg),
            repr(cfg),
            error=lambda: rel(dq, dq_ref),
        )
    # whole backwards: as routed by default, and the Triton-language passes alone
    measure(
        "backward_default",
        lambda: fat.flash_backward_triton(q, k, v, o, do, lse, True),
        flop=flop_b,
    )
    measure(
        "tl_dkdv+dq",
        lambda: fat.flash_backward_triton(q, k, v, o, do, lse, True, blocks=tl_blocks),
        flop=flop_b,
    )
    # where the Triton-language backward's time goes, kernel by kernel
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fat.flash_backward_triton(q, k, v, o, do, lse, True, blocks=tl_blocks)
            torch.cuda.synchronize()
        kern = {
            e.key[:60]: round(e.device_time_total / 5 / 1000, 4)
            for e in prof.key_averages()
            if e.device_type.name == "CUDA"
        }
        emit(out, dict(part="bench", d=d, impl="tl_backward_kernels_ms", kernels=kern))
    except Exception as exc:
        emit(
            out,
            dict(part="bench", d=d, impl="tl_backward_kernels_ms", status=f"error: {exc}"[:300]),
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--part", default="all")
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--rep-ms", type=float, default=200)
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("--configs", nargs="*", default=[])
    p.add_argument("--dkdv-configs", nargs="*", default=[])
    p.add_argument("--dq-configs", nargs="*", default=[])
    p.add_argument("--head-dims", type=lambda t: [int(x) for x in t.split(",")], default=[64, 128])
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part == "all":
        for part in ("check", "bench"):
            t0 = time.time()
            cmd = [
                sys.executable,
                __file__,
                "--out",
                str(out),
                "--part",
                part,
                "--seq-len",
                str(args.seq_len),
                "--rep-ms",
                str(args.rep_ms),
                "--configs",
                *args.configs,
                "--dkdv-configs",
                *args.dkdv_configs,
                "--dq-configs",
                *args.dq_configs,
                "--head-dims",
                ",".join(map(str, args.head_dims)),
            ]
            try:
                rc = subprocess.run(cmd, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            emit(out, dict(part=part, rc=rc, seconds=round(time.time() - t0, 1)))
        return
    {"check": lambda: check(out, args), "bench": lambda: bench(out, args)}[args.part]()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
