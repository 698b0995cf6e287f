"""Stage `ceilings`: what this machine can do, measured, so ratios are against it.

Large matmuls in bf16, tf32 and fp32 (TFLOP/s) and a device-to-device copy (GB/s, bytes read
plus bytes written), on random data, verified before timed. Each dtype is measured at several
square sizes, each `repeats` times, after `warm_s` seconds of matmuls that bring a GPU's
clocks up: every measurement is a row, and the best of a (dtype, path) is marked `best` (the
ceiling every reader takes: the largest rate). Each matmul row names its `path`:
`matmul` (`a @ b` on tensors of the dtype) and, for bf16, also `autocast_linear`: `F.linear` on
fp32 weights and inputs under bf16 autocast, the path the model's bf16 points take (casts
included), which is the ceiling their MFU is taken against (a CPU without a fast bf16 matmul can
run the autocast path at a very different rate than the plain one).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from cs336_systems.core.device import autocast, memory_shortfall
from cs336_systems.core.harness import PointResult, device_time, run_point
from cs336_systems.core.results import provenance, write_csv
from cs336_systems.planning.knobs import add_block_argument, add_run_arguments
from cs336_systems.planning.log import configure, get_logger, point, status_level
from cs336_systems.stages.ceilings.plan import CeilingsKnobs, sizes_of

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


# the matmul paths measured: a plain `a @ b` in the dtype, and the model's bf16 path
PATHS = {"matmul": "a @ b on tensors of the dtype", "autocast_linear": "autocast F.linear"}
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "tf32": 5e-3, "fp32": 1e-5}


def matmul_point(
    dtype_name: str, n: int, device: torch.device, reps: int, path: str = "matmul"
) -> dict:
    """2 n³ FLOPs of an n x n matmul through `path`: `matmul` (`a @ b`, both of the dtype) or
    `autocast_linear` (`F.linear(x, w)` with fp32 x and w under bf16 autocast, as the model's
    bf16 points run its linears: the casts are part of the time)."""
    if path not in PATHS:
        raise ValueError(f"unknown matmul path {path!r}; known: {sorted(PATHS)}")
    if path == "autocast_linear" and dtype_name != "bf16":
        raise ValueError("the autocast path is measured for bf16 only")
    dtype = DTYPES[dtype_name] if path == "matmul" else torch.float32
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
        if path == "matmul":

            def fn():
                return a @ b

            ref_b = b.double()
        else:

            def fn():
                with autocast("bf16", device):
                    return F.linear(a, b)  # a @ b.T, the weight's layout

            ref_b = b.double().T
        # verify on a slice against float64 before timing
        out = fn()
        ref = a[:64].double() @ ref_b
        err = ((out[:64].double() - ref).norm() / ref.norm()).item()
        tol = TOLERANCE[dtype_name]
        if not err < tol:
            raise RuntimeError(f"matmul check failed: relative error {err:.2e} >= {tol}")
        ms = time_ms(fn, device, reps)
        return {"ms_median": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12, "rel_error": err}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def mark_best(rows: list[dict]) -> None:
    """`best` on the fastest ok matmul row of each (dtype, path): the ceiling."""
    best: dict[tuple, dict] = {}
    for r in rows:
        r["best"] = False
        if r["status"] == "ok":
            key = (r["dtype"], r["path"])
            if key not in best or r["tflops"] > best[key]["tflops"]:
                best[key] = r
    for r in best.values():
        r["best"] = True


def matmul_paths(dtypes: list[str]) -> list[tuple[str, str]]:
    """(dtype, path) of every matmul row: each dtype plainly, bf16 also as the model runs it."""
    out = [(d, "matmul") for d in dtypes]
    if "bf16" in dtypes:
        out.append(("bf16", "autocast_linear"))
    return out


def copy_point(mbytes: int, device: torch.device, reps: int) -> dict:
    n = mbytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise RuntimeError("copy check failed")
    ms = time_ms(lambda: dst.copy_(src), device, reps)
    return {"ms_median": ms, "gbps": 2 * n * 4 / (ms * 1e-3) / 1e9}


def warm_up(device: torch.device, seconds: float) -> float:
    """bf16 matmuls for `seconds` on a GPU (its clocks rise from idle under load); the seconds
    spent (0 on a CPU or for 0)."""
    if device.type != "cuda" or seconds <= 0:
        return 0.0
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def fitting_point(need_mib: float, device: torch.device, what: str, fn) -> PointResult:
    """`run_point(fn)`, or a `skipped:` point when its buffers cannot fit in the memory free
    now: checked before anything is allocated."""
    if skip := memory_shortfall(need_mib, device, what):
        return PointResult(skip)
    return run_point(fn)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's own arguments (where its rows go and what they say they come from) and the
    stage's knobs as one value (`--block`: its preset block, `CeilingsKnobs`)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(ap)
    add_block_argument(ap, CeilingsKnobs)
    args = ap.parse_args(argv)
    if args.out is None:
        ap.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure("ceilings")
    k: CeilingsKnobs = args.block
    sizes = sizes_of(k)  # each dtype's sizes: its own, then its extra ones
    repeats = k.repeats or 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = provenance(args.machine, args.preset, args.edition)
    rows = []
    warmed = warm_up(device, float(k.warm_s or 0))
    if warmed:
        log.info("warmed the GPU up for %.1f s of bf16 matmuls", warmed)
    for name, path in matmul_paths(list(k.dtypes)):
        for n in sizes[name]:
            for rep in range(repeats):
                again = [f"repeat {rep + 1}/{repeats}"] if repeats > 1 else []
                with point("matmul", name, *([] if path == "matmul" else [path]), f"n={n}", *again):
                    # two operands and the product (the autocast path adds bf16 copies)
                    size = DTYPES[name].itemsize if path == "matmul" else 4 + DTYPES[name].itemsize
                    need = 3 * n**2 * size / 2**20
                    res = fitting_point(
                        need,
                        device,
                        f"a {n}^2 {name} matmul",
                        lambda d=name, p=path, n=n: matmul_point(d, n, device, k.reps, p),
                    )
                    tflops = (res.value or {}).get("tflops", float("nan"))
                    log.log(status_level(res.status), "%s %.3g TFLOP/s", res.status, tflops)
                rows.append(
                    {
                        **base,
                        "kind": "matmul",
                        "dtype": name,
                        "path": path,
                        "size": n,
                        "repeat": rep + 1,
                        "warm_s": warmed,
                        "status": res.status,
                        **(res.value or {}),
                    }
                )
    mark_best(rows)
    with point("copy", f"{k.copy_mb} MiB"):
        res = fitting_point(  # source and destination
            2 * k.copy_mb,
            device,
            f"a copy of {k.copy_mb} MiB",
            lambda: copy_point(k.copy_mb, device, k.reps),
        )
        gbps = (res.value or {}).get("gbps", float("nan"))
        log.log(status_level(res.status), "%s %.1f GB/s", res.status, gbps)
    rows.append(
        {
            **base,
            "kind": "copy",
            "dtype": "fp32",
            "path": "copy_",
            "size": k.copy_mb * 2**20,
            "status": res.status,
            **(res.value or {}),
        }
    )
    rows[-1]["best"] = rows[-1]["status"] == "ok"
    write_csv(rows, args.out)
    log.info("wrote %s: %d rows", args.out, len(rows))


if __name__ == "__main__":
    main()
