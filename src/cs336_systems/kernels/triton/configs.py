"""Tiles of the Triton-language kernels: the candidates the autotuner tries on a GPU per kernel,
operand width and head dim, and the small fixed tiles of the interpreter. Plain data: the
dispatch (`kernels.dispatch`) reads it to plan a call without loading Triton."""

from __future__ import annotations

import torch

# Interpreter mode runs each program in numpy: small tiles keep the tests' tile logic busy.
INTERPRET_BLOCKS = {
    "forward": (16, 16),
    "backward_dkdv": (16, 16),
    "backward_dq": (16, 16),
    "backward_fused": (16, 16),
}

# (BLOCK_Q, BLOCK_K, num_warps, num_stages) per kernel, operand width and head dim ("16bit" for
# d <= 64, "16bit-d128" above). Few on purpose: every (head dim, dtype, causal) combination
# compiles each of them; benchmarks/flash_tune.py measures the wider grid they were picked from.
# fp32 operands get small tiles: the full-precision (non tensor-core) dot needs many registers
# and compiles slowly with big tiles.
TILE_CONFIGS = {
    "forward": {
        "16bit": [(64, 128, 4, 2), (128, 128, 4, 3), (64, 64, 4, 2)],
        "16bit-d128": [(128, 64, 4, 2), (128, 128, 8, 3), (64, 64, 4, 3)],
        "32bit": [(64, 32, 4, 2), (32, 32, 4, 2)],
    },
    "backward_dkdv": {
        "16bit": [(32, 128, 8, 2), (32, 64, 4, 2)],
        "16bit-d128": [(64, 128, 8, 3), (64, 64, 4, 2)],
        "32bit": [(32, 32, 4, 2), (32, 64, 4, 2)],
    },
    "backward_dq": {
        "16bit": [(128, 64, 8, 3), (128, 32, 4, 3)],
        "16bit-d128": [(64, 32, 4, 4), (128, 64, 8, 4)],
        "32bit": [(32, 32, 4, 2), (64, 32, 4, 2)],
    },
    # one pass for dK, dV and (accumulated in fp32) dQ: measured slower than the two passes on
    # an H100, so only used when asked for (fuse_dq=True)
    "backward_fused": {
        "16bit": [(64, 64, 4, 2), (64, 128, 8, 3)],
        "16bit-d128": [(64, 128, 8, 3), (32, 128, 8, 3)],
        "32bit": [(32, 32, 4, 2)],
    },
}

KERNELS = ("forward", "backward_dkdv", "backward_dq", "backward_fused")
TUNE_KEY = [
    "N_Q_BUCKET",
    "N_K_BUCKET",
    "HEAD_DIM",
    "IS_CAUSAL",
    "PRECISION",
    "USE_DESC",
    "FUSE_DQ",
]


def _width(dtype: torch.dtype, head_dim: int) -> str:
    if dtype == torch.float32:
        return "32bit"
    return "16bit" if head_dim <= 64 else "16bit-d128"


def tile_configs(
    kernel: str, dtype: torch.dtype, head_dim: int = 64
) -> list[tuple[int, int, int, int]]:
    """The candidate tiles of `kernel` ('forward', 'backward_dkdv', 'backward_dq')."""
    return list(TILE_CONFIGS[kernel][_width(dtype, head_dim)])
