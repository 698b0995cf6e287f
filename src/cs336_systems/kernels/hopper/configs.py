"""Where the Hopper kernels run and with which tiles: per head dim, the configuration of each pass
(BLOCK_M, BLOCK_N, num_warps, STAGES[, switches]). Plain data, no Gluon: the dispatch
(`kernels.dispatch`) reads these tables to plan a call without importing the kernels."""

from __future__ import annotations

HEAD_DIMS = (16, 32, 64, 128)

# Where these kernels are used, and with which tiles: (BLOCK_M, BLOCK_N, num_warps, STAGES) per
# head dim, for the head dims at which they measured faster than the Triton-language kernels
# (H100, batch 1, 16 heads, 16384 tokens, causal bf16; benchmarks/flash_hopper_check.py,
# docs/notes/flash-attention-notes.md). Other head dims in HEAD_DIMS run when asked for (`config=`).
# Both forwards are warp-specialized (WS): a producer warp and BLOCK_M / 64 consumer warpgroups
# of 64 rows each, launched with 4 warps per consumer + 1 whatever num_warps says; PINGPONG: the
# consumers take turns to issue their products (at d = 64: three consumers at 160 registers).
# HEADS_TOGETHER: g heads' programs launched together (hopper/common.py: program_tile), so the
# programs in flight share those heads' rows in L2; the launcher applies it where a head has at
# least TOGETHER_MIN_TILES programs (hopper/launch.py), long sequences. Also on the dK/dV pass.
FORWARD_CONFIGS = {
    64: (192, 128, 4, 2, {"WS": True, "PINGPONG": True, "HEADS_TOGETHER": 2}),
    128: (128, 128, 4, 2, {"WS": True, "HEADS_TOGETHER": 2}),
}

# dK/dV: BLOCK_M query rows per step, BLOCK_N keys per program; A_IN_REGS: K and V are held in
# registers as the A operands of S^T and dP^T; WS: warp-specialized, a producer warp and two
# consumer warpgroups of BLOCK_N / 2 keys sharing each Q and dO tile (240 registers per
# consumer thread, one CTA per SM). FUSE_DQ: the pass computes dQ too (no dQ pass); with WS a
# third warpgroup takes the consumers' dS tiles (a ring of DS_BUFS) and adds dS K into an fp32
# dQ by TMA reductions, the consumers keeping 216 registers (so K and V stay in shared memory).
# At d = 64 that is five products per tile pair instead of the two passes' seven: under the
# H100's power cap the leaderboard step measured 0.97x cuDNN against 1.00x for the two passes.
# SERIAL: each consumer waits for a query tile's products within the tile, so its score tiles
# and its dK, dV accumulators (64 keys x 128 at d = 128) are never live beside the previous
# tile's operands; with FUSE_DQ the consumers then compute dQ themselves (no third warpgroup),
# each half of its columns from both consumers' dS tiles, one tile behind. At d = 128, n = 16384
# (forward+backward, B=1, H=16, causal bf16) that measured 0.99x cuDNN on one H100 host (7.45
# against 7.49 ms) and 1.04x on another (7.68 against 7.41, seven interleaved rounds), where the
# one-warpgroup pass (32, 64, 4, 3) and the dQ pass took 1.24x and 1.14x on the same hosts.
DKDV_CONFIGS = {
    16: (64, 64, 4, 3),
    32: (64, 64, 4, 3),
    64: (64, 128, 4, 3, {"WS": True, "FUSE_DQ": True, "DS_BUFS": 3, "HEADS_TOGETHER": 2}),
    128: (
        64,
        128,
        4,
        2,
        {"WS": True, "SERIAL": True, "FUSE_DQ": True, "DS_BUFS": 3, "HEADS_TOGETHER": 2},
    ),
}

# dQ: BLOCK_M query rows per program, BLOCK_N keys per step; WS: a producer warp and BLOCK_M / 64
# consumer warpgroups sharing each K and V tile. Where it runs (the head dim's dK/dV pass does
# not fuse dQ), this pass runs before the dK/dV pass and computes D itself. At d = 64 and 128
# FUSE_DQ took its place (the d = 128 tiles stay for a dK/dV configuration that does not fuse:
# two consumers, three do not fit in shared memory, measured 2.39 ms against 2.80 + 0.05 for
# the Triton-language pass and the D kernel, n = 16384, each pass alone); d = 16 and 32 keep
# the Triton-language pass.
DQ_CONFIGS = {64: (192, 64, 4, 3, {"WS": True}), 128: (128, 64, 4, 3, {"WS": True})}

CONFIGS = {"forward": FORWARD_CONFIGS, "backward_dkdv": DKDV_CONFIGS, "backward_dq": DQ_CONFIGS}

DEFAULT_CONFIGS = {
    "forward": (128, 64, 8, 3),
    "backward_dkdv": (32, 128, 8, 3),
    "backward_dq": (128, 64, 4, 3, {"WS": True}),
}

# The dK/dV pass that computes dQ too (TMA reductions into fp32), head dims 16-64: correct, but
# on an H100 it measured slower than the two passes (3.90 against 2.09 + 1.25 ms at d = 64), so
# no head dim routes to it (docs/notes/flash-attention-notes.md, version 16)
FUSED_DQ_CONFIG = (64, 64, 4, 3, {"FUSE_DQ": True})


def routed(kernel: str, head_dim: int) -> bool:
    """Whether `kernel` ("forward", "backward_dkdv", "backward_dq") at this head dim runs on these
    kernels by default (where they measured faster); `kernels.dispatch.plan` asks."""
    return head_dim in CONFIGS[kernel]


def config_for(kernel: str, head_dim: int) -> tuple:
    """The configuration `kernel` runs with at this head dim: its routed one, else the default."""
    return CONFIGS[kernel].get(head_dim, DEFAULT_CONFIGS[kernel])


def fuses_dq(head_dim: int, config=None) -> bool:
    """Whether the dK/dV pass at this head dim (or `config`) also computes dQ (FUSE_DQ)."""
    config = config or config_for("backward_dkdv", head_dim)
    return bool(len(config) > 4 and config[4].get("FUSE_DQ"))


def tensors_fit(*tensors) -> bool:
    """Whether the kernels' TMA descriptors take these (batch, heads, n, d) tensors: 4-D, one
    dtype, unit last stride, 16-byte aligned base and strides (zero strides are fine)."""
    dtype = tensors[0].dtype
    size = tensors[0].element_size()
    for t in tensors:
        if t.dtype != dtype or t.data_ptr() % 16:
            return False
        strides = t.stride()
        if len(strides) != 4 or strides[3] != 1:
            return False
        if (strides[0] * size) % 16 or (strides[1] * size) % 16 or (strides[2] * size) % 16:
            return False
    return True
