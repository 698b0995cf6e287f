"""Stage `ceilings`: what this machine can do, measured, so ratios are against it.

A large matmul in bf16, tf32 and fp32 (TFLOP/s) and a device-to-device copy (GB/s, bytes read
plus bytes written), on random data, verified before timed.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.core.harness import run_point, summarize, time_steps
from cs336_systems.core.results import provenance, write_csv

DTYPES = {
    "bf16": torch.bfloat16,
    "tf32": torch.float32,
    "fp32": torch.float32,
    "fp16": torch.float16,
}


def time_ms(fn, device: torch.device, reps: int) -> float:
    """Median time of fn: do_bench (CUDA events) on a GPU, the harness on a CPU."""
    if device.type == "cuda":
        import triton.testing

        return float(
            triton.testing.do_bench(fn, warmup=100, rep=max(reps, 100), return_mode="median")
        )
    _, times = time_steps(fn, warmup=1, steps=reps, device=device)
    return summarize(times, "t")["t_ms_median"]


def matmul_point(dtype_name: str, n: int, device: torch.device, reps: int) -> dict:
    dtype = DTYPES[dtype_name]
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        # verify on a slice against float64 before timing
        out = a @ b
        ref = a[:64].double() @ b.double()
        err = ((out[:64].double() - ref).norm() / ref.norm()).item()
        tol = {"bf16": 2e-2, "fp16": 5e-3, "tf32": 5e-3, "fp32": 1e-5}[dtype_name]
        if not err < tol:
            raise RuntimeError(f"matmul check failed: relative error {err:.2e} >= {tol}")
        ms = time_ms(lambda: a @ b, device, reps)
        return {"ms_median": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12, "rel_error": err}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def copy_point(mbytes: int, device: torch.device, reps: int) -> dict:
    n = mbytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise RuntimeError("copy check failed")
    ms = time_ms(lambda: dst.copy_(src), device, reps)
    return {"ms_median": ms, "gbps": 2 * n * 4 / (ms * 1e-3) / 1e9}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--matmul-size", type=int, default=8192)
    ap.add_argument("--dtypes", default="bf16,tf32,fp32")
    ap.add_argument("--copy-mb", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = provenance(args.machine, args.preset)
    rows = []
    for name in args.dtypes.split(","):
        res = run_point(lambda name=name: matmul_point(name, args.matmul_size, device, args.reps))
        rows.append(
            {
                **base,
                "kind": "matmul",
                "dtype": name,
                "size": args.matmul_size,
                "status": res.status,
                **(res.value or {}),
            }
        )
        print(
            f"[ceilings] matmul {name} n={args.matmul_size}: {res.status} "
            f"{(res.value or {}).get('tflops', float('nan')):.1f} TFLOP/s",
            flush=True,
        )
    res = run_point(lambda: copy_point(args.copy_mb, device, args.reps))
    rows.append(
        {
            **base,
            "kind": "copy",
            "dtype": "fp32",
            "size": args.copy_mb * 2**20,
            "status": res.status,
            **(res.value or {}),
        }
    )
    print(
        f"[ceilings] copy {args.copy_mb} MiB: {res.status} "
        f"{(res.value or {}).get('gbps', float('nan')):.1f} GB/s",
        flush=True,
    )
    write_csv(rows, args.out)


if __name__ == "__main__":
    main()
