"""Stage `ceilings`: what this machine can do, measured, so ratios are against it.

A large matmul in bf16, tf32 and fp32 (TFLOP/s) and a device-to-device copy (GB/s, bytes read
plus bytes written), on random data, verified before timed.
"""

from __future__ import annotations

import argparse

import torch

from cs336_systems.core.device import memory_shortfall
from cs336_systems.core.harness import PointResult, device_time, run_point
from cs336_systems.core.log import configure, get_logger, point, status_level
from cs336_systems.core.results import provenance, write_csv

log = get_logger(__name__)

DTYPES = {
    "bf16": torch.bfloat16,
    "tf32": torch.float32,
    "fp32": torch.float32,
    "fp16": torch.float16,
}


def time_ms(fn, device: torch.device, reps: int) -> float:
    """Median time of fn: do_bench (100 ms warm-up, at least 100 ms of runs) on a GPU, `reps`
    synchronized steps after one warm-up on a CPU (harness.device_time)."""
    stats = device_time(
        fn, device, "t", warmup_ms=100, rep_ms=max(reps, 100), warmup_steps=1, steps=reps
    )
    return stats["t_ms_median"]


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


def fitting_point(need_mib: float, device: torch.device, what: str, fn) -> PointResult:
    """`run_point(fn)`, or a `skipped:` point when its buffers cannot fit in the memory free
    now: checked before anything is allocated."""
    if skip := memory_shortfall(need_mib, device, what):
        return PointResult(skip)
    return run_point(fn)


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
    configure("ceilings")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = provenance(args.machine, args.preset)
    rows = []
    for name in args.dtypes.split(","):
        with point("matmul", name, f"n={args.matmul_size}"):
            # two operands and the product
            need = 3 * args.matmul_size**2 * DTYPES[name].itemsize / 2**20
            res = fitting_point(
                need,
                device,
                f"a {args.matmul_size}^2 {name} matmul",
                lambda n=name: matmul_point(n, args.matmul_size, device, args.reps),
            )
            log.info("%s %.1f TFLOP/s", res.status, (res.value or {}).get("tflops", float("nan")))
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
    with point("copy", f"{args.copy_mb} MiB"):
        res = fitting_point(  # source and destination
            2 * args.copy_mb,
            device,
            f"a copy of {args.copy_mb} MiB",
            lambda: copy_point(args.copy_mb, device, args.reps),
        )
        gbps = (res.value or {}).get("gbps", float("nan"))
        log.log(status_level(res.status), "%s %.1f GB/s", res.status, gbps)
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
    write_csv(rows, args.out)
    log.info("wrote %s: %d rows", args.out, len(rows))


if __name__ == "__main__":
    main()
