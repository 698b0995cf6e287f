"""Host side of the Triton-language kernels: autotuning (or fixed tiles) at launch, tensor
descriptors (TMA) where the tensors fit them, the launch of each pass, and compiling the
autotuner's candidates ahead of time in worker processes (`precompile`)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from cs336_systems.kernels.bound_launch import Launched
from cs336_systems.kernels.triton.backward import (
    _attn_bwd_dkdv,
    _attn_bwd_dq,
    _attn_bwd_preprocess,
)
from cs336_systems.kernels.triton.common import INTERPRET, LOG2E
from cs336_systems.kernels.triton.configs import KERNELS, TILE_CONFIGS, TUNE_KEY, tile_configs
from cs336_systems.kernels.triton.forward import _attn_fwd

# ----------------------------------------------------------------------------- autotuning


def _triton_configs(kernel: str) -> list[triton.Config]:
    tiles = dict.fromkeys(t for group in TILE_CONFIGS[kernel].values() for t in group)
    return [
        triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=st)
        for bq, bk, w, st in tiles
    ]


def _pruner(kernel: str):
    def prune(configs, named_args, **kwargs):
        """Keep the tiles meant for this operand width and head dim, not far larger than the
        problem."""
        args = {**named_args, **kwargs}
        allowed = set(tile_configs(kernel, args["Q"].dtype, args["HEAD_DIM"]))
        n_q, n_k = args["N_Q_BUCKET"], args["N_K_BUCKET"]
        kept = [
            c
            for c in configs
            if (c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) in allowed
        ]
        small = [
            c
            for c in kept
            if c.kwargs["BLOCK_Q"] <= max(n_q, 64) and c.kwargs["BLOCK_K"] <= max(n_k, 64)
        ]
        return small or kept[-1:]

    return prune


def _bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _autotuned(kernel_fn, kernel: str):
    options = dict(
        configs=_triton_configs(kernel),
        key=TUNE_KEY,
        prune_configs_by={"early_config_prune": _pruner(kernel)},
    )
    try:  # short benchmarks and an on-disk cache of the choice, where this Triton has them
        return triton.autotune(**options, do_bench=_bench, cache_results=True)(kernel_fn)
    except TypeError:
        return triton.autotune(**options)(kernel_fn)


_RAW = {
    "forward": _attn_fwd,
    "backward_dkdv": _attn_bwd_dkdv,
    "backward_dq": _attn_bwd_dq,
    "backward_fused": _attn_bwd_dkdv,
}


_TUNED = {} if INTERPRET else {name: _autotuned(fn, name) for name, fn in _RAW.items()}


def launch(kernel: str, args: tuple, meta: dict, n_tiles_of, bh: int, tiles):
    """Launch `kernel` on a (batch x heads, tiles) grid, autotuned (`tiles` None, on a GPU) or
    with `tiles`: a (BLOCK_Q, BLOCK_K) pair, or a dict with BLOCK_Q, BLOCK_K and optionally
    num_warps, num_stages and the kernel's own compile-time switches. `n_tiles_of(BLOCK_Q,
    BLOCK_K)` sizes the grid. Returns the configuration that ran (`chosen_configs()`' form) and
    the launch (`bound_launch.Launched`: what a program binds to replay it)."""
    tuned = _TUNED.get(kernel)
    if tiles is None:
        if tuned is None:
            raise ValueError(f"{kernel}: no tiles given and no autotuner in the interpreter")
        compiled = tuned[lambda c: (bh, n_tiles_of(c["BLOCK_Q"], c["BLOCK_K"]))](*args, **meta)
        best = tuned.best_config
        chosen = {
            **best.kwargs,
            "num_warps": best.num_warps,
            "num_stages": best.num_stages,
            "use_desc": meta["USE_DESC"],
            "autotuned": True,
        }
        grid = (bh, n_tiles_of(best.kwargs["BLOCK_Q"], best.kwargs["BLOCK_K"]))
        # a config's pre-hook runs at every launch: such a launch is not replayed
        launched = (
            None
            if best.pre_hook
            else (tuned.fn, compiled, grid, args, {**meta, **best.all_kwargs()})
        )
        return chosen, launched and Launched(*launched)
    if not isinstance(tiles, dict):
        tiles = dict(zip(("BLOCK_Q", "BLOCK_K"), tiles, strict=True))
    bq, bk = check_blocks((tiles["BLOCK_Q"], tiles["BLOCK_K"]))
    options = {k: tiles[k] for k in ("num_warps", "num_stages") if tiles.get(k)}
    # other keys are the kernel's own compile-time switches
    extra = {k: v for k, v in tiles.items() if k not in ("BLOCK_Q", "BLOCK_K", *options)}
    grid = (bh, n_tiles_of(bq, bk))
    kwargs = {**meta, **extra, "BLOCK_Q": bq, "BLOCK_K": bk, **options}
    compiled = _RAW[kernel][grid](*args, **kwargs)
    chosen = {
        "BLOCK_Q": bq,
        "BLOCK_K": bk,
        "num_warps": options.get("num_warps"),
        "num_stages": options.get("num_stages"),
        "use_desc": meta["USE_DESC"],
        "autotuned": False,
    }
    return chosen, Launched(_RAW[kernel], compiled, grid, args, kwargs)


# ----------------------------------------------------------------------------- tensor descriptors


def _alloc(size: int, alignment: int, stream) -> torch.Tensor:
    """Scratch for device-side tensor descriptors (128 bytes per program)."""
    device = "cpu" if INTERPRET else "cuda"
    return torch.empty(size, dtype=torch.int8, device=device)


@functools.cache
def descriptors_supported() -> bool:
    """Device-side tensor descriptors (TMA): Hopper or newer, or the interpreter; off with
    CS336_FLASH_DESC=0 (read once per process)."""
    if os.environ.get("CS336_FLASH_DESC", "1") == "0" or not hasattr(tl, "make_tensor_descriptor"):
        return False
    if INTERPRET:
        return True
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def descriptors_fit(tensors, d: int, d_pad: int) -> bool:
    """Every tensor addressable by a 2-D (rows x d) descriptor: unit feature stride, 16-byte
    aligned base and row stride, d a power of two (no padded features)."""
    if d != d_pad:
        return False
    for x in tensors:
        row = x.stride(-2) * x.element_size()
        if x.stride(-1) != 1 or row <= 0 or row % 16 or x.data_ptr() % 16:
            return False
        if x.dim() == 4 and any(s * x.element_size() % 16 for s in x.stride()[:2]):
            return False
    return True


def use_descriptors(tensors, d: int, d_pad: int, use_desc: bool | None) -> bool:
    """Whether the passes address `tensors` through tensor descriptors: `use_desc` if given
    (ValueError where they do not fit), else for 16-bit inputs that fit, where supported."""
    if use_desc is None:
        use_desc = (
            tensors[0].dtype != torch.float32
            and descriptors_supported()
            and descriptors_fit(tensors, d, d_pad)
        )
    elif use_desc and not descriptors_fit(tensors, d, d_pad):
        raise ValueError(
            "tensor descriptors need unit feature strides, 16-byte aligned rows and d a power of two"
        )
    if use_desc:
        set_allocator()
    return bool(use_desc)


def set_allocator() -> None:
    """Scratch for device-side descriptors: Triton's allocator is a context variable, so every
    thread that launches such a kernel (autograd runs backward in its own) sets it."""
    triton.set_allocator(_alloc)


# ----------------------------------------------------------------------------- precompiling

_KERNEL_TENSORS = {
    # kernel -> (tensor args as "in"put dtype or fp32, number of 4-stride groups)
    "forward": (("in", "in", "in", "in", "f32"), 4),
    "backward_dkdv": (("in", "in", "in", "in", "f32", "f32", "in", "in", "in"), 7),
    "backward_fused": (("in", "in", "in", "in", "f32", "f32", "in", "in", "f32"), 7),
    "backward_dq": (("in", "in", "in", "in", "f32", "f32", "in"), 5),
    "preprocess": (("in", "in", "f32", "f32"), 2),
}


def _warmup_job(job: tuple) -> str:
    """Compile one kernel variant into Triton's on-disk cache (runs in a worker process)."""
    kernel, dtype_name, d, causal, precision, tiles, use_desc = job
    try:
        dtype = getattr(torch, dtype_name)
        fn = {**_RAW, "preprocess": _attn_bwd_preprocess}[kernel]
        kinds, n_stride_groups = _KERNEL_TENSORS[kernel]
        tensors = [dtype if kind == "in" else torch.float32 for kind in kinds]
        n = 128  # contiguous (1, 1, n, d): the same divisibility classes as real launches
        strides = (n * d, n * d, d, 1) * n_stride_groups
        d_pad = max(16, triton.next_power_of_2(d))
        meta = dict(HEAD_DIM=d, D_PAD=d_pad)
        if kernel == "preprocess":  # `tiles`: whether it zeroes a dQ accumulator
            sizes = (1, n)
            meta.update(BLOCK_Q=64, ZERO_DQ=bool(tiles))
        else:
            scales = (0.125,) if kernel == "forward" else (0.125, 0.125)
            sizes = (1, n, n, *scales, n, n)
            bq, bk, warps, stages = tiles
            meta.update(IS_CAUSAL=causal, PRECISION=precision, USE_DESC=use_desc)
            if kernel.startswith("backward_") and kernel != "backward_dq":
                meta["FUSE_DQ"] = kernel == "backward_fused"
            meta.update(BLOCK_Q=bq, BLOCK_K=bk, num_warps=warps, num_stages=stages, num_ctas=1)
        fn.warmup(*tensors, *strides, *sizes, grid=(1,), **meta)
        return ""
    except Exception as exc:  # the autotuner compiles what is missing anyway
        return f"{kernel} {dtype_name} d={d} {tiles}: {type(exc).__name__}: {exc}"[:300]


def precompile(
    dtypes=(torch.bfloat16,),
    head_dims=(64,),
    causal=(True,),
    workers: int | None = None,
    tiles: dict | None = None,
) -> dict:
    """Compile every kernel variant the autotuner will try for these settings (or, with
    `tiles={kernel: [(BLOCK_Q, BLOCK_K, warps, stages), ...]}`, those tiles), in parallel worker
    processes, into Triton's on-disk cache; the autotuner then only loads and times them.

    Compiling is CPU-bound and single-threaded per kernel; a stage that sweeps head dims and
    dtypes would otherwise spend minutes compiling one kernel after another.
    """
    import concurrent.futures
    import multiprocessing
    import time

    if INTERPRET or not torch.cuda.is_available():
        return {"jobs": 0, "seconds": 0.0, "errors": []}
    jobs = []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        for d in head_dims:
            d_pad = max(16, triton.next_power_of_2(d))
            # what contiguous inputs of this dtype and head dim run with
            use_desc = dtype != torch.float32 and descriptors_supported() and d == d_pad
            for zero_dq in (False, True):
                jobs.append(("preprocess", name, d, False, "", zero_dq, False))
            for is_causal in causal:
                for kernel in (tiles or {}).keys() or KERNELS[:3]:
                    for tile in (tiles or {}).get(kernel) or tile_configs(kernel, dtype, d):
                        prec = matmul_precision(dtype)
                        jobs.append((kernel, name, d, bool(is_causal), prec, tile, use_desc))
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1, 16))
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        errors = [e for e in pool.map(_warmup_job, jobs) if e]
    return {"jobs": len(jobs), "seconds": time.perf_counter() - t0, "errors": errors}


# ----------------------------------------------------------------------------- shapes


def as_4d(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 4 else x.unsqueeze(1)


def strides_of(x: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(x.stride())  # type: ignore[return-value]


def pow2_bucket(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 16))


def matmul_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"  # ignored for fp16/bf16 operands


def problem_shape(q4, k4, v4):
    b, h, n_q, d = q4.shape
    n_k = k4.shape[-2]
    d_pad = max(16, triton.next_power_of_2(d))
    return b, h, n_q, n_k, d, d_pad


def check_blocks(blocks: tuple[int, int]) -> tuple[int, int]:
    bq, bk = (int(x) for x in blocks)
    for x in (bq, bk):
        if x < 16 or x & (x - 1):
            raise ValueError(f"tile sizes must be powers of two >= 16, got {blocks}")
    return bq, bk


# ----------------------------------------------------------------------------- the passes


def forward(q4, k4, v4, o, lse, is_causal: bool, tiles, desc: bool):
    """The forward kernel on (batch, heads, n, d) inputs into `o` and `lse` (fp32, (batch,
    heads, n_q)) with `tiles` (None: autotuned), through tensor descriptors where `desc`
    (`use_descriptors`): (the configuration that ran, the launch)."""
    b, h, n_q, n_k, d, d_pad = problem_shape(q4, k4, v4)
    sm_scale = d**-0.5
    args = (
        q4,
        k4,
        v4,
        o,
        lse,
        *strides_of(q4),
        *strides_of(k4),
        *strides_of(v4),
        *strides_of(o),
        h,
        n_q,
        n_k,
        sm_scale * LOG2E,
        pow2_bucket(n_q),
        pow2_bucket(n_k),
    )
    meta = dict(
        HEAD_DIM=d,
        D_PAD=d_pad,
        IS_CAUSAL=bool(is_causal),
        PRECISION=matmul_precision(q4.dtype),
        USE_DESC=desc,
    )
    return launch("forward", args, meta, lambda bq, bk: triton.cdiv(n_q, bq), b * h, tiles)


def preprocess(o4, do4, delta, block_q: int, dq_acc=None):
    """D = rowsum(O * dO) into `delta` ((batch, heads, n_q) fp32); with `dq_acc` (an fp32
    (batch, heads, n_q, d) contiguous tensor) the same programs also zero its rows, so a dQ
    accumulator needs no fill of its own. Returns the launch."""
    b, h, n_q, d = o4.shape
    grid = (b * h, triton.cdiv(n_q, block_q))
    args = (
        o4,
        do4,
        delta,
        delta if dq_acc is None else dq_acc,
        *strides_of(o4),
        *strides_of(do4),
        h,
        n_q,
    )
    kwargs = dict(
        HEAD_DIM=d,
        D_PAD=max(16, triton.next_power_of_2(d)),
        BLOCK_Q=block_q,
        ZERO_DQ=dq_acc is not None,
    )
    compiled = _attn_bwd_preprocess[grid](*args, **kwargs)
    return Launched(_attn_bwd_preprocess, compiled, grid, args, kwargs)


def _backward_args(q4, k4, v4, do4, is_causal: bool, desc: bool):
    """(strides, scalars, compile-time constants) the dK/dV and dQ kernels share."""
    b, h, n_q, n_k, d, d_pad = problem_shape(q4, k4, v4)
    sm_scale = d**-0.5
    strides = (*strides_of(q4), *strides_of(k4), *strides_of(v4), *strides_of(do4))
    scalars = (h, n_q, n_k, sm_scale * LOG2E, sm_scale, pow2_bucket(n_q), pow2_bucket(n_k))
    meta = dict(
        HEAD_DIM=d,
        D_PAD=d_pad,
        IS_CAUSAL=bool(is_causal),
        PRECISION=matmul_precision(q4.dtype),
        USE_DESC=desc,
    )
    return strides, scalars, meta


def backward_dkdv(q4, k4, v4, do4, lse, delta, dk, dv, dq, is_causal, desc, fuse_dq, tiles):
    """dK and dV into `dk`, `dv` (and with `fuse_dq`, dQ added into `dq`, an fp32 tensor that
    starts at zero), with `tiles` (None: autotuned): (the configuration that ran, the launch)."""
    b, h, n_q, n_k, d, d_pad = problem_shape(q4, k4, v4)
    strides, scalars, meta = _backward_args(q4, k4, v4, do4, is_causal, desc)
    args = (q4, k4, v4, do4, lse, delta, dk, dv, dq, *strides)
    return launch(
        "backward_fused" if fuse_dq else "backward_dkdv",
        (*args, *strides_of(dk), *strides_of(dv), *strides_of(dq), *scalars),
        {**meta, "FUSE_DQ": bool(fuse_dq)},
        lambda bq, bk: triton.cdiv(n_k, bk),
        b * h,
        tiles,
    )


def backward_dq(q4, k4, v4, do4, lse, delta, dq, is_causal, desc, tiles):
    """dQ into `dq`, with `tiles` (None: autotuned): (the configuration that ran, the launch)."""
    b, h, n_q, n_k, d, d_pad = problem_shape(q4, k4, v4)
    strides, scalars, meta = _backward_args(q4, k4, v4, do4, is_causal, desc)
    args = (q4, k4, v4, do4, lse, delta, dq, *strides, *strides_of(dq), *scalars)
    return launch("backward_dq", args, meta, lambda bq, bk: triton.cdiv(n_q, bq), b * h, tiles)
