"""What the workflow needs to plan the flash stage's jobs, from the stage's config block."""

from __future__ import annotations

import math

from cs336_systems.core.config import Checker, Facts, head_dim_problem

# our Triton kernel's largest head dim (kernels/flash_triton_common.py:MAX_HEAD_DIM; a test keeps them
# equal); SDPA's CUDA backends need multiples of 8
MAX_HEAD_DIM = 128


def gate(stages: list[str], results: str) -> list[str]:
    """The kernel tests' CSV when that stage runs (it then gates our kernels), else nothing."""
    return [f"{results}/kernel_tests.csv"] if "kernel_tests" in stages else []


def gate_arg(gate_file: str) -> str:
    return f"--kernel-tests {gate_file}" if gate_file else ""


def seq_cap(caps: dict, impl: str, dtype: str) -> float:
    """The longest n `impl` runs in `dtype` under `max_seq_len` ({impl: n} or {impl: {dtype: n}});
    inf where nothing caps it."""
    cap = caps.get(impl, math.inf)
    return cap.get(dtype, math.inf) if isinstance(cap, dict) else cap


def caps_arg(caps: dict) -> str:
    """`max_seq_len` as the sweep's --max-seq-len: 'flash_pytorch=16384,flash_triton:fp32=16384'."""
    items = []
    for impl, cap in caps.items():
        pairs = cap.items() if isinstance(cap, dict) else [(None, cap)]
        items += [f"{impl}:{dtype}={n}" if dtype else f"{impl}={n}" for dtype, n in pairs]
    return ",".join(items)


def parse_caps(text: str) -> dict:
    """The inverse of caps_arg."""
    caps: dict = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        impl, _, dtype = name.partition(":")
        if dtype:
            caps.setdefault(impl, {})[dtype] = int(value)
        else:
            caps[impl] = int(value)
    return caps


def options(cfg: dict) -> str:
    """The timing, cap and precision options every flash job shares."""
    timing = cfg["timing"]
    caps = caps_arg(cfg["max_seq_len"])
    tiles = ",".join(str(t) for t in cfg["flash_pytorch_tiles"])
    return (
        f"--max-seq-len '{caps}' --flash-tiles {tiles}"
        f" --fp32-matmul-precision {cfg['fp32_matmul_precision']}"
        f" --warmup-ms {timing['warmup_ms']} --rep-ms {timing['rep_ms']}"
        f" --warmup-steps {timing['warmup_steps']} --steps {timing['steps']}"
    )


def leaderboard_timing(cfg: dict, block: str = "leaderboard") -> str:
    """The leaderboard point's (or the target set's) own do_bench windows, where configured
    (they override the sweep's)."""
    board = cfg[block]
    return " ".join(
        f"--{key.replace('_', '-')} {board[key]}" for key in ("warmup_ms", "rep_ms") if key in board
    )


def point_files(cfg: dict, results: str) -> list[str]:
    files = [f"{results}/flash/points/{dtype}.csv" for dtype in cfg["dtypes"]]
    files += [f"{results}/flash/target.csv"] if cfg.get("target") else []
    return files + ([f"{results}/flash/leaderboard.csv"] if cfg.get("leaderboard") else [])


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    for i, d in enumerate(cfg["head_dims"]):
        if why := head_dim_problem(d, MAX_HEAD_DIM):
            at.fail(("head_dims", i), d, why)
    for i, d in enumerate((cfg.get("target") or {}).get("head_dims", [])):
        if why := head_dim_problem(d, MAX_HEAD_DIM):
            at.fail(("target", "head_dims", i), d, why)
    board = cfg.get("leaderboard")
    if board and (why := head_dim_problem(board["head_dim"], MAX_HEAD_DIM)):
        at.fail(("leaderboard", "head_dim"), board["head_dim"], why)
