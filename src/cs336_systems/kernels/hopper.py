"""FlashAttention-2 kernels for Hopper GPUs (H100, H200) in Gluon, Triton's lower-level dialect.

Why a second set of kernels: in Triton's own language (``flash_attention_triton.py``) every
matrix product whose result feeds the softmax is followed by a wait for all outstanding tensor-core
work (Triton 3.6's WGMMA pipeliner makes such a dot synchronous), so within a warpgroup the
exponentials and the matrix products never overlap. Gluon exposes the asynchronous ``wgmma``
directly: the forward issues the scores of key tile j+1 and the product P_j V_j back to back,
waits for the scores only (``warpgroup_mma_wait(1)``), and computes the softmax of tile j+1 while
the tensor cores are still busy with P_j V_j: FlashAttention-3's intra-warpgroup overlap. K and V
tiles stream through a ring of shared-memory buffers filled by TMA (bulk tensor copies) ahead of
use.

Scope: compute capability 9.x, fp16/bf16, head dim 16, 32, 64 or 128, tensors whose last dim
is contiguous and whose other strides are 16-byte aligned. ``supported()`` says whether a call
qualifies; ``flash_attention_triton`` uses these kernels when it does and its own kernels
otherwise (other GPUs, fp32, other head dims, Triton's interpreter on CPU).

Conventions are those of ``flash_attention_triton``: (batch, heads, n, d) tensors, causal masking
top-left aligned (query i sees key j iff i >= j), L the natural-log logsumexp in fp32.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
from triton._C.libtriton import ir as _ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}

# Where these kernels are used, and with which tiles: (BLOCK_M, BLOCK_N, num_warps, STAGES) per
# head dim, for the head dims at which they measured faster than the Triton-language kernels
# (H100, batch 1, 16 heads, 16384 tokens, causal bf16; scripts/flash_hopper_check.py,
# docs/flash-attention-notes.md). Other head dims in HEAD_DIMS run when asked for (`config=`).
# Both forwards are warp-specialized (WS): a producer warp and BLOCK_M / 64 consumer warpgroups
# of 64 rows each, launched with 4 warps per consumer + 1 whatever num_warps says; PINGPONG: the
# consumers take turns to issue their products (at d = 64: three consumers at 160 registers).
FORWARD_CONFIGS = {
    64: (192, 128, 4, 2, {"WS": True, "PINGPONG": True}),
    128: (128, 128, 4, 2, {"WS": True}),
}
# dK/dV: BLOCK_M query rows per step, BLOCK_N keys per program; A_IN_REGS: K and V are held in
# registers as the A operands of S^T and dP^T; WS: warp-specialized, a producer warp and two
# consumer warpgroups of BLOCK_N / 2 keys sharing each Q and dO tile (240 registers per
# consumer thread, one CTA per SM). FUSE_DQ: the pass computes dQ too (no dQ pass); with WS a
# third warpgroup takes the consumers' dS tiles (a ring of DS_BUFS) and adds dS K into an fp32
# dQ by TMA reductions, the consumers keeping 216 registers (so K and V stay in shared memory).
# At d = 64 that is five products per tile pair instead of the two passes' seven: under the
# H100's power cap the leaderboard step measured 0.97x cuDNN against 1.00x for the two passes.
DKDV_CONFIGS = {
    16: (64, 64, 4, 3),
    32: (64, 64, 4, 3),
    64: (64, 128, 4, 3, {"WS": True, "FUSE_DQ": True, "DS_BUFS": 3}),
    128: (32, 64, 4, 3),
}
# dQ: BLOCK_M query rows per program, BLOCK_N keys per step; WS: a producer warp and BLOCK_M / 64
# consumer warpgroups sharing each K and V tile. Where it runs (the head dim's dK/dV pass does
# not fuse dQ), this pass runs before the dK/dV pass and computes D itself. Measured at d = 64
# only (before FUSE_DQ took its place there); other head dims keep the Triton-language dQ pass.
DQ_CONFIGS = {64: (192, 64, 4, 3, {"WS": True})}
CONFIGS = {"forward": FORWARD_CONFIGS, "backward_dkdv": DKDV_CONFIGS, "backward_dq": DQ_CONFIGS}
DEFAULT_CONFIGS = {
    "forward": (128, 64, 8, 3),
    "backward_dkdv": (32, 128, 8, 3),
    "backward_dq": (128, 64, 4, 3, {"WS": True}),
}
# The dK/dV pass that computes dQ too (TMA reductions into fp32), head dims 16-64: correct, but
# on an H100 it measured slower than the two passes (3.90 against 2.09 + 1.25 ms at d = 64), so
# no head dim routes to it (docs/flash-attention-notes.md, version 16)
FUSED_DQ_CONFIG = (64, 64, 4, 3, {"FUSE_DQ": True})


@gluon.constexpr_function
def _mma_layout(num_warps, n):
    """wgmma accumulator layout of a (BLOCK_M x n) tile: warps stacked along the rows, 16 rows
    each (a warpgroup covers 64 rows)."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16]
    )


@gluon.jit
def _mask_scores(s, offs_m, offs_n, n_k, IS_CAUSAL: gl.constexpr):
    """-inf where the key is past n_k or (causal) after the query."""
    valid = gl.expand_dims(offs_n, 0) < n_k
    if IS_CAUSAL:
        valid = valid & (gl.expand_dims(offs_m, 1) >= gl.expand_dims(offs_n, 0))
    return gl.where(valid, s, float("-inf"))


@gluon.jit
def _softmax_update(s, m_i, l_i, qk_scale):
    """Online softmax over one tile of raw scores: new running max (scaled, log2 units),
    unnormalised probabilities, running sum and the factor that rescales what came before."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the global tile of `tensor_desc` at `coord` (a TMA
    bulk tensor reduction, cp.reduce.async.bulk.tensor; rows out of bounds are skipped); waited
    for by `tma.store_wait` like a TMA store. Triton 3.6's Gluon has the op but no wrapper."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        _ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


@gluon.jit
def _load_kv(desc, bar, smem, off_b, off_h, tile, n_tiles, BLOCK_N: gl.constexpr):
    """Start the TMA copy of key/value tile `tile` (if it exists) into `smem`, signalling `bar`."""
    pred = tile < n_tiles
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [off_b, off_h, tile * BLOCK_N, 0], bar, smem, pred=pred)


@gluon.jit
def _kv_ring_barriers(STAGES: gl.constexpr, NC: gl.constexpr):
    """The mbarriers of a warp-specialized kernel whose producer loads a Q tile once and streams
    K/V through a ring of STAGES slots to NC consumers, initialised and fenced:
    (q_bar, k_ready, v_ready, k_empty, v_empty), the "empty" ones released by every consumer."""
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NC)
        mbarrier.init(v_empty.index(i), count=NC)
    fence_async_shared()
    return q_bar, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def _load_kv_ring(k_desc, v_desc, k_smem, v_smem, bars, off_b, off_h, n_tiles):
    """The producer warps' K/V stream: K_j and V_j into ring slot j % STAGES, each as soon as
    every consumer has released that slot (`bars` = (q_bar, k_ready, v_ready, k_empty,
    v_empty))."""
    _, k_ready, v_ready, k_empty, v_empty = bars
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    for j in range(n_tiles):
        stage = j % STAGES
        # a fresh mbarrier counts as having completed the phase before phase 0: the first
        # round of waits passes at once
        free = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(stage), free)
        _load_kv(
            k_desc, k_ready.index(stage), k_smem.index(stage), off_b, off_h, j, n_tiles, BLOCK_N
        )
        mbarrier.wait(v_empty.index(stage), free)
        _load_kv(
            v_desc, v_ready.index(stage), v_smem.index(stage), off_b, off_h, j, n_tiles, BLOCK_N
        )


@gluon.jit
def _turn_start(turn, C: gl.constexpr):
    """Ping-pong between the consumer warpgroups of a warp-specialized kernel (FlashAttention-3's):
    `turn` holds one mbarrier per consumer; consumer C issues its k-th round of products after
    `_turn_wait(turn, C, k)` and hands the turn on with `_turn_pass`, so the consumers issue in
    a fixed rotation and one warpgroup's softmax runs while another's products keep the tensor
    cores busy. Every consumer must run the same number of rounds. Here the last consumer
    passes the turn as if it had issued a round -1."""
    if C == turn.shape[0] - 1:
        mbarrier.arrive(turn.index(0), count=1)


@gluon.jit
def _turn_wait(turn, C: gl.constexpr, k):
    mbarrier.wait(turn.index(C), k & 1)


@gluon.jit
def _turn_pass(turn, C: gl.constexpr):
    mbarrier.arrive(turn.index((C + 1) % turn.shape[0]), count=1)


@gluon.jit
def _query_tile(
    n_heads, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr
):
    """Where a forward program works, on a (batch x heads, query tiles) grid with, under causal
    masking, the heaviest query tiles first: its (batch x head) index, batch, head, first query
    row, and its key tiles [0, n_tiles), of which those from first_masked on cross the diagonal
    or the ragged end."""
    pid_bh = gl.program_id(0)
    if IS_CAUSAL:
        pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    else:
        pid_m = gl.program_id(1)
    q0 = pid_m * BLOCK_M
    if IS_CAUSAL:
        hi = gl.minimum(n_k, q0 + BLOCK_M)
        first_masked = gl.minimum(q0, n_k) // BLOCK_N
    else:
        hi = n_k
        first_masked = n_k // BLOCK_N
    return pid_bh, pid_bh // n_heads, pid_bh % n_heads, q0, gl.cdiv(hi, BLOCK_N), first_masked


@gluon.jit
def _attn_fwd_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    L,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid_bh, off_b, off_h, q0, n_tiles, first_masked = _query_tile(
        n_heads, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL
    )

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [off_b, off_h, q0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(k_desc, k_bars.index(i), k_smem.index(i), off_b, off_h, i, n_tiles, BLOCK_N)
        _load_kv(v_desc, v_bars.index(i), v_smem.index(i), off_b, off_h, i, n_tiles, BLOCK_N)

    q = q_smem.reshape([BLOCK_M, HEAD_DIM])
    offs_m = q0 + gl.arange(0, BLOCK_M, layout=rows_s)
    offs_nb = gl.arange(0, BLOCK_N, layout=cols_s)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # tile 0: scores and softmax, nothing to overlap with yet
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    k_t = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s = warpgroup_mma(q, k_t, s_init, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    if first_masked == 0:
        s = _mask_scores(s, offs_m, offs_nb, n_k, IS_CAUSAL)
    p, m_i, l_i, alpha = _softmax_update(s, m_i, l_i, qk_scale)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    # K_0 is consumed (by every warpgroup): its buffer takes K_STAGES
    gl.thread_barrier()
    _load_kv(k_desc, k_bars.index(0), k_smem.index(0), off_b, off_h, STAGES, n_tiles, BLOCK_N)

    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        # issue S_j = Q K_j^T, then P_{j-1} V_{j-1}; wait for S_j only
        mbarrier.wait(k_bars.index(stage), (j // STAGES) & 1)
        k_t = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k_t, s_init, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        v = v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM])
        acc = warpgroup_mma(p_op, v, acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s])
        # softmax of tile j while the tensor cores finish P_{j-1} V_{j-1}
        if j >= first_masked:
            s = _mask_scores(s, offs_m, j * BLOCK_N + offs_nb, n_k, IS_CAUSAL)
        p, m_i, l_i, alpha = _softmax_update(s, m_i, l_i, qk_scale)
        # p_op is read from registers by the product in flight: it stays alive until the wait
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # K_j and V_{j-1} are consumed (by every warpgroup): refill their buffers
        gl.thread_barrier()
        _load_kv(
            k_desc,
            k_bars.index(stage),
            k_smem.index(stage),
            off_b,
            off_h,
            j + STAGES,
            n_tiles,
            BLOCK_N,
        )
        _load_kv(
            v_desc,
            v_bars.index(prev),
            v_smem.index(prev),
            off_b,
            off_h,
            j - 1 + STAGES,
            n_tiles,
            BLOCK_N,
        )

    last = n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    v = v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM])
    acc = warpgroup_mma(p_op, v, acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    o = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    # Q's buffer takes O once no warpgroup reads Q any more; the TMA store clips rows >= n_q
    gl.thread_barrier()
    q.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [off_b, off_h, q0, 0], q_smem)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(L + pid_bh * n_q + offs_m, lse, mask=offs_m < n_q)
    tma.store_wait(0)


@gluon.jit
def _fwd_loader(
    q_desc,
    k_desc,
    v_desc,
    q_smem,
    k_smem,
    v_smem,
    bars,
    off_b,
    off_h,
    q0,
    n_tiles,
):
    """Producer warp of the warp-specialized forward: each consumer's rows of the Q tile once,
    then K_j and V_j into ring slot j % STAGES as soon as every consumer has released the slot."""
    q_bar = bars[0]
    NC: gl.constexpr = q_smem.shape[0]
    rows: gl.constexpr = q_desc.block_type.shape[2]
    mbarrier.expect(q_bar, NC * q_desc.block_type.nbytes)
    for c in gl.static_range(NC):
        tma.async_copy_global_to_shared(
            q_desc, [off_b, off_h, q0 + c * rows, 0], q_bar, q_smem.index(c)
        )
    _load_kv_ring(k_desc, v_desc, k_smem, v_smem, bars, off_b, off_h, n_tiles)


@gluon.jit
def _fwd_consumer(
    q_buf,
    r0,
    tile,
    IS_CAUSAL: gl.constexpr,
    C: gl.constexpr,
    PINGPONG: gl.constexpr,
):
    """One consumer warpgroup of the warp-specialized forward: query rows r0 + [0, BLOCK_M), whose
    Q tile is in `q_buf`, through the loop of `_attn_fwd_kernel` with each K and V slot released
    through an mbarrier; its warps synchronise among themselves only, never with the other
    warpgroup. `tile` holds what both consumers share; the tile sizes come from the buffers'
    shapes. C: this consumer's index; PINGPONG: the consumers take turns to issue their
    products (`_turn_start`)."""
    (
        k_smem,
        v_smem,
        bars,
        o_desc,
        L,
        pid_bh,
        off_b,
        off_h,
        n_q,
        n_k,
        n_tiles,
        first_masked,
        qk_scale,
        turn,
    ) = tile
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    BLOCK_M: gl.constexpr = q_buf.shape[2]
    HEAD_DIM: gl.constexpr = q_buf.shape[3]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    dtype: gl.constexpr = q_buf.dtype
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q = q_buf.reshape([BLOCK_M, HEAD_DIM])
    offs_m = r0 + gl.arange(0, BLOCK_M, layout=rows_s)
    offs_nb = gl.arange(0, BLOCK_N, layout=cols_s)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, rows_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    k_t = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
    s = warpgroup_mma(q, k_t, s_init, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s])
    mbarrier.arrive(k_empty.index(0), count=1)
    if first_masked == 0:
        s = _mask_scores(s, offs_m, offs_nb, n_k, IS_CAUSAL)
    p, m_i, l_i, alpha = _softmax_update(s, m_i, l_i, qk_scale)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    if PINGPONG:
        _turn_start(turn, C)
    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(stage), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        if PINGPONG:
            _turn_wait(turn, C, j - 1)
        k_t = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k_t, s_init, use_acc=False, is_async=True)
        v = v_smem.index(prev).reshape([BLOCK_N, HEAD_DIM])
        acc = warpgroup_mma(p_op, v, acc, is_async=True)
        if PINGPONG:
            _turn_pass(turn, C)
        s = warpgroup_mma_wait(1, deps=[s])
        mbarrier.arrive(k_empty.index(stage), count=1)
        if j >= first_masked:
            s = _mask_scores(s, offs_m, j * BLOCK_N + offs_nb, n_k, IS_CAUSAL)
        p, m_i, l_i, alpha = _softmax_update(s, m_i, l_i, qk_scale)
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    v = v_smem.index(last % STAGES).reshape([BLOCK_N, HEAD_DIM])
    acc = warpgroup_mma(p_op, v, acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])

    # this warpgroup's Q buffer takes its O rows; the TMA store clips rows >= n_q
    o = acc / gl.expand_dims(gl.convert_layout(l_i, rows_o), 1)
    q.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [off_b, off_h, r0, 0], q_buf)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(L + pid_bh * n_q + offs_m, lse, mask=offs_m < n_q)
    tma.store_wait(0)


@gluon.jit
def _attn_fwd_ws_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    L,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    PINGPONG: gl.constexpr = False,
):
    """The forward with warp specialization (FlashAttention-3's): one producer warp issues the
    TMA copies of Q, K and V; BLOCK_M / 64 (2 or 3) consumer warpgroups, each in its own
    partition, compute 64 query rows each and never wait for each other.
    Launched with num_warps=4 (the default partition is the first consumer)."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    NC: gl.constexpr = BLOCK_M // ROWS
    gl.static_assert((NC == 2) | (NC == 3), "two or three consumer warpgroups")
    pid_bh, off_b, off_h, q0, n_tiles, first_masked = _query_tile(
        n_heads, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL
    )

    q_smem = gl.allocate_shared_memory(dtype, [NC] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    turn = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NC):
        mbarrier.init(turn.index(c), count=1)
    bars = _kv_ring_barriers(STAGES, NC)
    # what both consumers share (IS_CAUSAL apart: a constexpr in a tuple arrives as a tensor)
    tile = (
        k_smem,
        v_smem,
        bars,
        o_desc,
        L,
        pid_bh,
        off_b,
        off_h,
        n_q,
        n_k,
        n_tiles,
        first_masked,
        qk_scale,
        turn,
    )
    loads = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, off_b, off_h, q0, n_tiles)
    # (constexprs go straight into the partitions' argument tuples: inside a tuple variable
    # they would arrive as tensors)
    if NC == 2:
        gl.warp_specialize(
            [
                (_fwd_consumer, (q_smem.index(0), q0, tile, IS_CAUSAL, 0, PINGPONG)),
                (_fwd_consumer, (q_smem.index(1), q0 + ROWS, tile, IS_CAUSAL, 1, PINGPONG)),
                (_fwd_loader, loads),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )
    else:
        gl.warp_specialize(
            [
                (_fwd_consumer, (q_smem.index(0), q0, tile, IS_CAUSAL, 0, PINGPONG)),
                (_fwd_consumer, (q_smem.index(1), q0 + ROWS, tile, IS_CAUSAL, 1, PINGPONG)),
                (
                    _fwd_consumer,
                    (q_smem.index(2), q0 + 2 * ROWS, tile, IS_CAUSAL, 2, PINGPONG),
                ),
                (_fwd_loader, loads),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, 24],
        )


@gluon.jit
def _attn_bwd_dkdv_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dk_desc,
    dv_desc,
    dq_desc,
    L,
    Delta,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    sm_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    A_IN_REGS: gl.constexpr = False,
    FUSE_DQ: gl.constexpr = False,
):
    """dV = P^T dO and dK = scale * dS^T Q for one tile of BLOCK_N keys, over the query tiles
    that see it, in transposed form (keys are rows). Q and dO tiles stream through a TMA ring.

    Per query tile i the warpgroup issues S_i^T, dP_i^T and the previous tile's dV and dK
    products, waits for S_i^T only, computes P_i^T while the others run, waits for dP_i^T and
    computes dS_i^T while the previous tile's products still run.

    FUSE_DQ: the pass also computes dQ (no separate dQ pass). dS_i^T goes to shared memory, the
    next iteration issues dQ_i = dS_i K beside tile i's dV and dK products, and each tile's
    scaled dQ is added into the fp32 tensor of `dq_desc` by a TMA bulk reduction (the programs of
    all key tiles add into the same rows; the tensor starts at zero)."""
    dtype: gl.constexpr = q_desc.dtype
    st_layout: gl.constexpr = _mma_layout(num_warps, BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(num_warps, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    rows: gl.constexpr = gl.SliceLayout(1, st_layout)

    # grid (batch x heads, key tiles); causal: key tile 0 sees every query, so ascending order
    # launches the heaviest programs first
    pid_bh = gl.program_id(0)
    k0 = gl.program_id(1) * BLOCK_N
    off_b = pid_bh // n_heads
    off_h = pid_bh % n_heads

    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    if FUSE_DQ:
        gl.static_assert(BLOCK_M == BLOCK_N, "the fused dQ product reuses the dK tile layout")
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
        ds_smem = gl.allocate_shared_memory(
            dtype, [BLOCK_N, BLOCK_M], ds_layout, gl.zeros([BLOCK_N, BLOCK_M], dtype, st_layout)
        )
        # two dQ tiles: one being added by TMA while the next is written
        dq_smem = gl.allocate_shared_memory(
            gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout
        )
    fence_async_shared()
    if FUSE_DQ:
        gl.thread_barrier()  # dS^T's zeros are written before the first dQ product reads them

    # query tiles lo_tile + [0, T); causal: tiles before the key tile's diagonal see none of it
    if IS_CAUSAL:
        lo_tile = k0 // BLOCK_M
    else:
        lo_tile = 0
    T = gl.cdiv(n_q, BLOCK_M) - lo_tile
    q_bytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes

    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [off_b, off_h, k0, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [off_b, off_h, k0, 0], kv_bar, v_smem)
    # tile 0 is loaded even when T <= 0: the last products read it (times zero)
    for i in gl.static_range(STAGES):
        _load_q_do(
            q_desc,
            do_desc,
            bars.index(i),
            q_smem.index(i),
            do_smem.index(i),
            off_b,
            off_h,
            (lo_tile + i) * BLOCK_M,
            (i < T) | (i == 0),
            q_bytes,
        )

    k = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v = v_smem.reshape([BLOCK_N, HEAD_DIM])
    offs_n = k0 + gl.arange(0, BLOCK_N, layout=rows)
    offs_mb = gl.arange(0, BLOCK_M, layout=cols)
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    acc_init = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    zero_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)

    # L and D of the next query tile are loaded a whole iteration ahead, one value per thread,
    # and spread to the score layout through shared memory when used
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    offs_flat = gl.arange(0, BLOCK_M, layout=flat)
    lse_next, delta_next = _load_rows_stats(L, Delta, pid_bh, n_q, lo_tile * BLOCK_M + offs_flat)
    dv = acc_init
    dk = acc_init
    # the previous tile's P^T and dS^T, the A operands of its dV and dK products: zero before
    # the first tile (whose products then add 0 x Q_0 and 0 x dO_0)
    p_op = zero_op
    ds_op = zero_op
    mbarrier.wait(kv_bar, 0)
    if A_IN_REGS:  # K and V as register operands: S^T and dP^T read only Q and dO from smem
        kv_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
        k_a = k.load(kv_op)
        v_a = v.load(kv_op)
    else:
        k_a = k
        v_a = v

    # Every product issued in an iteration is waited for in it: with products in flight across
    # the loop's back edge, ptxas cannot follow the wgmma pipeline and makes every product
    # synchronous (its "wgmma.mma_async instructions are serialized" note)
    for i in range(T):
        stage = i % STAGES
        older = (i + STAGES - gl.minimum(i, 1)) % STAGES  # tile i - 1's buffers (tile 0's at i = 0)
        offs_m = (lo_tile + i) * BLOCK_M + offs_mb
        mbarrier.wait(bars.index(stage), (i // STAGES) & 1)
        q_t = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        do_t = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        s_t = warpgroup_mma(k_a, q_t.permute((1, 0)), st_init, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_a, do_t.permute((1, 0)), st_init, use_acc=False, is_async=True)
        q_p = q_smem.index(older).reshape([BLOCK_M, HEAD_DIM])
        do_p = do_smem.index(older).reshape([BLOCK_M, HEAD_DIM])
        dv = warpgroup_mma(p_op, do_p, dv, is_async=True)
        dk = warpgroup_mma(ds_op, q_p, dk, is_async=True)
        if FUSE_DQ:  # tile i - 1's dQ (zeros at i = 0)
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k, acc_init, use_acc=False, is_async=True)
        lse = gl.convert_layout(lse_next, cols)
        delta = gl.convert_layout(delta_next, cols)
        s_t = warpgroup_mma_wait(4 if FUSE_DQ else 3, deps=[s_t])
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
        if IS_CAUSAL:
            if (lo_tile + i) * BLOCK_M < k0 + BLOCK_N:
                causal = gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1)
                p_t = gl.where(causal, p_t, 0.0)
        dp_t = warpgroup_mma_wait(3 if FUSE_DQ else 2, deps=[dp_t])
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        p_lo = p_t.to(dtype)
        ds_lo = ds_t.to(dtype)
        # tile i - 1's products are done; p_lo and ds_lo pass through the wait so that their
        # packing into operand registers (which may be the in-flight operands' registers)
        # comes after it
        if FUSE_DQ:
            dv, dk, dq, p_lo, ds_lo = warpgroup_mma_wait(0, deps=[dv, dk, dq, p_lo, ds_lo])
            row = (lo_tile + gl.maximum(i - 1, 0)) * BLOCK_M  # tile 0's rows (+ 0) at i = 0
            _reduce_dq(dq_desc, dq_smem.index(i % 2), dq * sm_scale, [off_b, off_h, row, 0])
            # dS_i^T for the next iteration's dQ product (read after the barrier below)
            ds_smem.store(ds_lo)
            fence_async_shared()
        else:
            dv, dk, p_lo, ds_lo = warpgroup_mma_wait(0, deps=[dv, dk, p_lo, ds_lo])
        p_op = gl.convert_layout(p_lo, op_layout)
        ds_op = gl.convert_layout(ds_lo, op_layout)
        # tile i - 1's Q and dO buffers are free: they take tile i - 1 + STAGES
        gl.thread_barrier()
        prev_stage = (i + STAGES - 1) % STAGES
        _load_q_do(
            q_desc,
            do_desc,
            bars.index(prev_stage),
            q_smem.index(prev_stage),
            do_smem.index(prev_stage),
            off_b,
            off_h,
            (lo_tile + i - 1 + STAGES) * BLOCK_M,
            (i >= 1) & (i - 1 + STAGES < T),
            q_bytes,
        )
        # the next tile's L and D, a whole iteration ahead of their use
        lse_next, delta_next = _load_rows_stats(
            L, Delta, pid_bh, n_q, (lo_tile + i + 1) * BLOCK_M + offs_flat
        )

    # the last tile's dV and dK products (with T <= 0: zeros times tile 0, loaded regardless)
    last = gl.maximum(T - 1, 0)
    mbarrier.wait(bars.index(last % STAGES), (last // STAGES) & 1)
    q_t = q_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_DIM])
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
    if FUSE_DQ:
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k, acc_init, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
        if T > 0:
            row = (lo_tile + T - 1) * BLOCK_M
            _reduce_dq(dq_desc, dq_smem.index(T % 2), dq * sm_scale, [off_b, off_h, row, 0])
    else:
        dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    # K's and V's buffers take dK and dV once no warpgroup reads them; TMA clips rows >= n_k
    gl.thread_barrier()
    k.store((dk * sm_scale).to(dtype))
    v.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [off_b, off_h, k0, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [off_b, off_h, k0, 0], v_smem)
    tma.store_wait(0)


@gluon.jit
def _dkdv_loader(
    q_desc,
    do_desc,
    k_desc,
    v_desc,
    q_smem,
    do_smem,
    k_smem,
    v_smem,
    bars,
    off_b,
    off_h,
    k0,
    lo_tile,
    T,
):
    """Producer warp of the warp-specialized dK/dV pass: both halves of the K and V tiles once,
    then Q_i and dO_i into ring slot i % STAGES as soon as both consumers have released it
    (tile 0 even when no query tile sees the keys: the consumers' last products read it)."""
    kv_bar, ready, empty = bars
    STAGES: gl.constexpr = q_smem.shape[0]
    HALF: gl.constexpr = k_desc.block_type.shape[2]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    mbarrier.expect(kv_bar, 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for c in gl.static_range(2):
        row = k0 + c * HALF
        tma.async_copy_global_to_shared(k_desc, [off_b, off_h, row, 0], kv_bar, k_smem.index(c))
        tma.async_copy_global_to_shared(v_desc, [off_b, off_h, row, 0], kv_bar, v_smem.index(c))
    nbytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes
    for i in range(gl.maximum(T, 1)):
        stage = i % STAGES
        # a fresh mbarrier counts as having completed the phase before phase 0
        mbarrier.wait(empty.index(stage), ((i // STAGES) & 1) ^ 1)
        _load_q_do(
            q_desc,
            do_desc,
            ready.index(stage),
            q_smem.index(stage),
            do_smem.index(stage),
            off_b,
            off_h,
            (lo_tile + i) * BLOCK_M,
            True,
            nbytes,
        )


@gluon.jit
def _dkdv_consumer(
    kc,
    k_buf,
    v_buf,
    tile,
    IS_CAUSAL: gl.constexpr,
    A_IN_REGS: gl.constexpr,
    C: gl.constexpr,
    FUSE_DQ: gl.constexpr,
):
    """One consumer warpgroup (C: 0 or 1) of the warp-specialized dK/dV pass: keys
    kc + [0, BLOCK_N), whose K and V tiles are in `k_buf`, `v_buf`, through the loop of
    `_attn_bwd_dkdv_kernel`, each Q and dO slot released through an mbarrier once this
    warpgroup's products have read it; its warps never wait for the other warpgroup. `tile`
    holds what both consumers share. FUSE_DQ: each dS_i^T also goes into a ring of shared-memory
    buffers for the dQ warpgroup (`_dkdv_dq_worker`)."""
    (
        q_smem,
        do_smem,
        bars,
        dk_desc,
        dv_desc,
        L,
        Delta,
        pid_bh,
        off_b,
        off_h,
        n_q,
        lo_tile,
        T,
        qk_scale,
        sm_scale,
        fused,
    ) = tile
    kv_bar, ready, empty = bars
    if FUSE_DQ:
        ds_smem, ds_ready, ds_free, fin = fused
    BLOCK_N: gl.constexpr = k_buf.shape[2]
    HEAD_DIM: gl.constexpr = k_buf.shape[3]
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    dtype: gl.constexpr = k_buf.dtype
    st_layout: gl.constexpr = _mma_layout(4, BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    rows: gl.constexpr = gl.SliceLayout(1, st_layout)

    k = k_buf.reshape([BLOCK_N, HEAD_DIM])
    v = v_buf.reshape([BLOCK_N, HEAD_DIM])
    offs_n = kc + gl.arange(0, BLOCK_N, layout=rows)
    offs_mb = gl.arange(0, BLOCK_M, layout=cols)
    st_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    acc_init = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    zero_op = gl.zeros([BLOCK_N, BLOCK_M], dtype, op_layout)
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs_flat = gl.arange(0, BLOCK_M, layout=flat)
    lse_next, delta_next = _load_rows_stats(L, Delta, pid_bh, n_q, lo_tile * BLOCK_M + offs_flat)
    dv = acc_init
    dk = acc_init
    p_op = zero_op
    ds_op = zero_op
    mbarrier.wait(kv_bar, 0)
    if A_IN_REGS:
        kv_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=st_layout, k_width=2)
        k_a = k.load(kv_op)
        v_a = v.load(kv_op)
    else:
        k_a = k
        v_a = v

    for i in range(T):
        stage = i % STAGES
        older = (i + STAGES - gl.minimum(i, 1)) % STAGES  # tile i - 1's slot (tile 0's at i = 0)
        offs_m = (lo_tile + i) * BLOCK_M + offs_mb
        mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
        q_t = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        do_t = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
        s_t = warpgroup_mma(k_a, q_t.permute((1, 0)), st_init, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_a, do_t.permute((1, 0)), st_init, use_acc=False, is_async=True)
        q_p = q_smem.index(older).reshape([BLOCK_M, HEAD_DIM])
        do_p = do_smem.index(older).reshape([BLOCK_M, HEAD_DIM])
        dv = warpgroup_mma(p_op, do_p, dv, is_async=True)
        dk = warpgroup_mma(ds_op, q_p, dk, is_async=True)
        lse = gl.convert_layout(lse_next, cols)
        delta = gl.convert_layout(delta_next, cols)
        s_t = warpgroup_mma_wait(3, deps=[s_t])
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
        if IS_CAUSAL:
            if (lo_tile + i) * BLOCK_M < kc + BLOCK_N:
                causal = gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1)
                p_t = gl.where(causal, p_t, 0.0)
        dp_t = warpgroup_mma_wait(2, deps=[dp_t])
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        p_lo = p_t.to(dtype)
        ds_lo = ds_t.to(dtype)
        dv, dk, p_lo, ds_lo = warpgroup_mma_wait(0, deps=[dv, dk, p_lo, ds_lo])
        if FUSE_DQ:
            _ds_in(ds_smem, ds_free, ds_ready, ds_lo, i, C)
        # tile i - 1's Q and dO slot is read by neither of this warpgroup's products any more
        if i >= 1:
            mbarrier.arrive(empty.index(older), count=1)
        p_op = gl.convert_layout(p_lo, op_layout)
        ds_op = gl.convert_layout(ds_lo, op_layout)
        lse_next, delta_next = _load_rows_stats(
            L, Delta, pid_bh, n_q, (lo_tile + i + 1) * BLOCK_M + offs_flat
        )

    last = gl.maximum(T - 1, 0)
    mbarrier.wait(ready.index(last % STAGES), (last // STAGES) & 1)
    q_t = q_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_DIM])
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
    dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
    if FUSE_DQ:  # the dQ warpgroup's products no longer read K
        mbarrier.wait(fin, 0)

    # this warpgroup's K and V buffers take its dK and dV rows; TMA clips rows >= n_k
    gl.thread_barrier()
    k.store((dk * sm_scale).to(dtype))
    v.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [off_b, off_h, kc, 0], k_buf)
    tma.async_copy_shared_to_global(dv_desc, [off_b, off_h, kc, 0], v_buf)
    tma.store_wait(0)


@gluon.jit
def _ds_in(ds_smem, ds_free, ds_ready, ds_lo, i, C: gl.constexpr):
    """Consumer C's dS_i^T into ring buffer i % NB, once the dQ product of the tile that used the
    buffer before is done; then signal `ds_ready` (both consumers)."""
    NB: gl.constexpr = ds_smem.shape[0] // 2
    b = i % NB
    mbarrier.wait(ds_free.index(b), ((i // NB) & 1) ^ 1)
    ds_smem.index(2 * b + C).store(ds_lo)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(ds_ready.index(b), count=1)


@gluon.jit
def _dkdv_dq_worker(
    k_smem,
    ds_smem,
    dq_smem,
    kv_bar,
    ds_ready,
    ds_free,
    fin,
    dq_desc,
    off_b,
    off_h,
    lo_tile,
    T,
    sm_scale,
):
    """The dQ warpgroup of the fused dK/dV pass (FUSE_DQ): for each query tile t, once both
    consumers' dS_t^T are in ring buffer t % NB, dQ_t = dS_t K over both halves of the keys
    (K from the consumers' shared-memory tiles), the buffer released (`ds_free`), and
    sm_scale dQ_t added into the fp32 rows of `dq_desc` by a TMA reduction through two staging
    tiles; `fin` once no product reads K any more."""
    NB: gl.constexpr = ds_smem.shape[0] // 2
    HALF: gl.constexpr = ds_smem.shape[1]
    BLOCK_M: gl.constexpr = ds_smem.shape[2]
    HEAD_DIM: gl.constexpr = k_smem.shape[4]
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, _mma_layout(4, HEAD_DIM))
    k_0 = k_smem.index(0).reshape([HALF, HEAD_DIM])
    k_1 = k_smem.index(1).reshape([HALF, HEAD_DIM])
    mbarrier.wait(kv_bar, 0)
    for t in range(T):
        b = t % NB
        mbarrier.wait(ds_ready.index(b), (t // NB) & 1)
        dq = warpgroup_mma(
            ds_smem.index(2 * b).permute((1, 0)), k_0, dq_init, use_acc=False, is_async=True
        )
        dq = warpgroup_mma(ds_smem.index(2 * b + 1).permute((1, 0)), k_1, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(ds_free.index(b), count=1)
        row = (lo_tile + t) * BLOCK_M
        _reduce_dq(dq_desc, dq_smem.index(t % 2), dq * sm_scale, [off_b, off_h, row, 0])
    mbarrier.arrive(fin, count=1)
    tma.store_wait(0)


@gluon.jit
def _attn_bwd_dkdv_ws_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dk_desc,
    dv_desc,
    dq_desc,
    L,
    Delta,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    sm_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    A_IN_REGS: gl.constexpr = False,
    FUSE_DQ: gl.constexpr = False,
    DS_BUFS: gl.constexpr = 3,
    DQ_REGS: gl.constexpr = 72,
):
    """The dK/dV pass with warp specialization: one producer warp issues the TMA copies; two
    consumer warpgroups, each in its own partition, own BLOCK_N / 2 keys each and share every
    Q and dO tile (loaded once for both), never waiting for each other. Launched with
    num_warps=4 (the default partition is the first consumer). FUSE_DQ: a third warpgroup
    (DQ_REGS registers) computes dQ from the consumers' dS tiles (DS_BUFS of them in a ring)
    into the fp32 tensor of `dq_desc`, which starts at zero (`_dkdv_dq_worker`)."""
    dtype: gl.constexpr = q_desc.dtype
    HALF: gl.constexpr = BLOCK_N // 2
    pid_bh = gl.program_id(0)
    k0 = gl.program_id(1) * BLOCK_N
    off_b = pid_bh // n_heads
    off_h = pid_bh % n_heads

    k_smem = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # released by both consumer warpgroups
    if FUSE_DQ:
        gl.static_assert(HALF == BLOCK_M, "dS^T tiles of 64 keys x 64 queries")
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, BLOCK_M], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [2 * DS_BUFS, HALF, BLOCK_M], ds_layout)
        dq_smem = gl.allocate_shared_memory(
            gl.float32, [2] + dq_desc.block_type.shape, dq_desc.layout
        )
        ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [DS_BUFS, 1], mbarrier.MBarrierLayout())
        fin = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for b in gl.static_range(DS_BUFS):
            mbarrier.init(ds_ready.index(b), count=2)  # both consumers' dS^T stored
            mbarrier.init(ds_free.index(b), count=1)  # the dQ product that read it is done
        mbarrier.init(fin, count=1)
        fused = (ds_smem, ds_ready, ds_free, fin)
    else:
        fused = (kv_bar,)
    fence_async_shared()

    if IS_CAUSAL:  # query tiles before the key tile's diagonal see none of it
        lo_tile = k0 // BLOCK_M
    else:
        lo_tile = 0
    T = gl.cdiv(n_q, BLOCK_M) - lo_tile
    bars = (kv_bar, ready, empty)
    tile = (
        q_smem,
        do_smem,
        bars,
        dk_desc,
        dv_desc,
        L,
        Delta,
        pid_bh,
        off_b,
        off_h,
        n_q,
        lo_tile,
        T,
        qk_scale,
        sm_scale,
        fused,
    )
    loads = (
        q_desc,
        do_desc,
        k_desc,
        v_desc,
        q_smem,
        do_smem,
        k_smem,
        v_smem,
        bars,
        off_b,
        off_h,
        k0,
        lo_tile,
        T,
    )
    k_1 = k_smem.index(1)
    v_1 = v_smem.index(1)
    # (constexprs go straight into the partitions' argument tuples: inside a tuple variable
    # they would arrive as tensors)
    if FUSE_DQ:
        dq_args = (k_smem, ds_smem, dq_smem, kv_bar, ds_ready, ds_free, fin, dq_desc, off_b, off_h)
        gl.warp_specialize(
            [
                (
                    _dkdv_consumer,
                    (k0, k_smem.index(0), v_smem.index(0), tile, IS_CAUSAL, A_IN_REGS, 0, True),
                ),
                (_dkdv_consumer, (k0 + HALF, k_1, v_1, tile, IS_CAUSAL, A_IN_REGS, 1, True)),
                (_dkdv_dq_worker, dq_args + (lo_tile, T, sm_scale)),
                (_dkdv_loader, loads),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, DQ_REGS, 24],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _dkdv_consumer,
                    (k0, k_smem.index(0), v_smem.index(0), tile, IS_CAUSAL, A_IN_REGS, 0, False),
                ),
                (_dkdv_consumer, (k0 + HALF, k_1, v_1, tile, IS_CAUSAL, A_IN_REGS, 1, False)),
                (_dkdv_loader, loads),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )


@gluon.jit
def _dq_loader(
    q_desc,
    do_desc,
    o_desc,
    k_desc,
    v_desc,
    q_smem,
    do_smem,
    o_smem,
    k_smem,
    v_smem,
    bars,
    off_b,
    off_h,
    q0,
    n_tiles,
    DELTA: gl.constexpr,
):
    """Producer warp of the warp-specialized dQ pass: every consumer's Q and dO rows (and O's,
    with DELTA) once, then K_j and V_j into ring slot j % STAGES as soon as every consumer has
    released the slot."""
    q_bar = bars[0]
    NC: gl.constexpr = q_smem.shape[0]
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    nbytes: gl.constexpr = q_desc.block_type.nbytes + do_desc.block_type.nbytes
    if DELTA:
        mbarrier.expect(q_bar, NC * (nbytes + o_desc.block_type.nbytes))
    else:
        mbarrier.expect(q_bar, NC * nbytes)
    for c in gl.static_range(NC):
        coord = [off_b, off_h, q0 + c * ROWS, 0]
        tma.async_copy_global_to_shared(q_desc, coord, q_bar, q_smem.index(c))
        tma.async_copy_global_to_shared(do_desc, coord, q_bar, do_smem.index(c))
        if DELTA:
            tma.async_copy_global_to_shared(o_desc, coord, q_bar, o_smem.index(c))
    _load_kv_ring(k_desc, v_desc, k_smem, v_smem, bars, off_b, off_h, n_tiles)


@gluon.jit
def _dq_consumer(
    q_smem, do_smem, o_smem, c: gl.constexpr, tile, IS_CAUSAL: gl.constexpr, DELTA: gl.constexpr
):
    """Consumer warpgroup c of the warp-specialized dQ pass: dQ = scale * dS K for query rows
    q0 + c * ROWS + [0, ROWS) (its tiles are q_smem.index(c), ...).

    Per key tile j it issues S_j = Q K_j^T, dP_j = dO V_j^T and the previous tile's dQ product
    (dS_{j-1} K_{j-1}, dS from registers), waits for S_j only, computes P_j while the others
    run, waits for dP_j (and releases V_j's slot) and computes dS_j while the dQ product still
    runs, then releases K_{j-1}'s slot. Nothing is in flight across the loop's back edge (see
    the dK/dV pass). Slots are released through mbarriers; it never waits for the other
    consumers. DELTA: D = rowsum(O * dO) of its rows is computed here and written to `Delta`."""
    (
        k_smem,
        v_smem,
        bars,
        dq_desc,
        L,
        Delta,
        pid_bh,
        off_b,
        off_h,
        q0,
        n_q,
        n_k,
        n_tiles,
        first_masked,
        qk_scale,
        sm_scale,
    ) = tile
    q_bar, k_ready, v_ready, k_empty, v_empty = bars
    q_buf = q_smem.index(c)
    do_buf = do_smem.index(c)
    o_buf = o_smem.index(c)
    ROWS: gl.constexpr = q_buf.shape[2]
    r0 = q0 + c * ROWS
    HEAD_DIM: gl.constexpr = q_buf.shape[3]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[3]
    dtype: gl.constexpr = q_buf.dtype
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    acc_layout: gl.constexpr = _mma_layout(4, HEAD_DIM)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)

    offs_m = r0 + gl.arange(0, ROWS, layout=rows_s)
    in_q = offs_m < n_q
    lse = gl.load(L + pid_bh * n_q + offs_m, mask=in_q, other=0.0) * 1.4426950408889634
    offs_nb = gl.arange(0, BLOCK_N, layout=cols_s)
    s_init = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    ds_op = gl.zeros([ROWS, BLOCK_N], dtype, ds_layout)
    q = q_buf.reshape([ROWS, HEAD_DIM])
    do = do_buf.reshape([ROWS, HEAD_DIM])
    mbarrier.wait(q_bar, 0)
    if DELTA:
        o_t = o_buf.reshape([ROWS, HEAD_DIM]).load(acc_layout).to(gl.float32)
        do_t = do.load(acc_layout).to(gl.float32)
        delta = gl.convert_layout(gl.sum(o_t * do_t, 1), rows_s)
        gl.store(Delta + pid_bh * n_q + offs_m, delta, mask=in_q)
    else:
        delta = gl.load(Delta + pid_bh * n_q + offs_m, mask=in_q, other=0.0)

    for j in range(n_tiles):
        stage = j % STAGES
        older = (j + STAGES - gl.minimum(j, 1)) % STAGES  # K_{j-1}'s slot (K_0's at j = 0)
        mbarrier.wait(k_ready.index(stage), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(stage), (j // STAGES) & 1)
        k_t = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k_t, s_init, use_acc=False, is_async=True)
        v_t = v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        dp = warpgroup_mma(do, v_t, s_init, use_acc=False, is_async=True)
        k_p = k_smem.index(older).reshape([BLOCK_N, HEAD_DIM])
        dq = warpgroup_mma(ds_op, k_p, dq, is_async=True)
        s = warpgroup_mma_wait(2, deps=[s])
        if j >= first_masked:
            s = _mask_scores(s, offs_m, j * BLOCK_N + offs_nb, n_k, IS_CAUSAL)
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))
        dp = warpgroup_mma_wait(1, deps=[dp])
        mbarrier.arrive(v_empty.index(stage), count=1)
        ds_lo = (p * (dp - gl.expand_dims(delta, 1))).to(dtype)
        dq, ds_lo = warpgroup_mma_wait(0, deps=[dq, ds_lo])
        if j >= 1:
            mbarrier.arrive(k_empty.index(older), count=1)
        ds_op = gl.convert_layout(ds_lo, ds_layout)

    if n_tiles > 0:
        k_p = k_smem.index((n_tiles - 1) % STAGES).reshape([BLOCK_N, HEAD_DIM])
        dq = warpgroup_mma(ds_op, k_p, dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(0, deps=[dq, ds_op])

    # this warpgroup's Q buffer takes its dQ rows; the TMA store clips rows >= n_q
    gl.thread_barrier()
    q.store((dq * sm_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [off_b, off_h, r0, 0], q_buf)
    tma.store_wait(0)


@gluon.jit
def _attn_bwd_dq_ws_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    o_desc,
    dq_desc,
    L,
    Delta,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    sm_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    DELTA: gl.constexpr = False,
):
    """The dQ pass with warp specialization: one producer warp issues the TMA copies; BLOCK_M /
    64 (2 or 3) consumer warpgroups of 64 query rows each, in their own partitions, share every
    K and V tile (loaded once for all) and never wait for each other. Launched with num_warps=4
    (the default partition is the first consumer)."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    NC: gl.constexpr = BLOCK_M // ROWS
    gl.static_assert((NC == 2) | (NC == 3), "two or three consumer warpgroups")
    pid_bh, off_b, off_h, q0, n_tiles, first_masked = _query_tile(
        n_heads, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL
    )

    q_smem = gl.allocate_shared_memory(dtype, [NC] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NC] + do_desc.block_type.shape, do_desc.layout)
    if DELTA:
        o_smem = gl.allocate_shared_memory(dtype, [NC] + o_desc.block_type.shape, o_desc.layout)
    else:
        o_smem = q_smem
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    bars = _kv_ring_barriers(STAGES, NC)
    tile = (
        k_smem,
        v_smem,
        bars,
        dq_desc,
        L,
        Delta,
        pid_bh,
        off_b,
        off_h,
        q0,
        n_q,
        n_k,
        n_tiles,
        first_masked,
        qk_scale,
        sm_scale,
    )
    loads = (
        q_desc,
        do_desc,
        o_desc,
        k_desc,
        v_desc,
        q_smem,
        do_smem,
        o_smem,
        k_smem,
        v_smem,
        bars,
        off_b,
        off_h,
        q0,
        n_tiles,
        DELTA,
    )
    # (constexprs go straight into the partitions' argument tuples: inside a tuple variable
    # they would arrive as tensors)
    if NC == 2:
        gl.warp_specialize(
            [
                (_dq_consumer, (q_smem, do_smem, o_smem, 0, tile, IS_CAUSAL, DELTA)),
                (_dq_consumer, (q_smem, do_smem, o_smem, 1, tile, IS_CAUSAL, DELTA)),
                (_dq_loader, loads),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )
    else:
        gl.warp_specialize(
            [
                (_dq_consumer, (q_smem, do_smem, o_smem, 0, tile, IS_CAUSAL, DELTA)),
                (_dq_consumer, (q_smem, do_smem, o_smem, 1, tile, IS_CAUSAL, DELTA)),
                (_dq_consumer, (q_smem, do_smem, o_smem, 2, tile, IS_CAUSAL, DELTA)),
                (_dq_loader, loads),
            ],
            [4, 4, 1],
            [CONSUMER_REGS, CONSUMER_REGS, 24],
        )


@gluon.jit
def _reduce_dq(dq_desc, buf, dq, coord):
    """Add the fp32 tile `dq` into the rows of `dq_desc` at `coord` by a TMA reduction through
    `buf`, one of two buffers used in turn (the reduction that read it before is waited for)."""
    tma.store_wait(1)
    gl.thread_barrier()
    buf.reshape([dq_desc.block_type.shape[2], dq_desc.block_type.shape[3]]).store(dq)
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(dq_desc, coord, buf)


@gluon.jit
def _load_rows_stats(L, Delta, pid_bh, n_q, offs_m):
    """L (in log2 units) and D of query rows `offs_m`; rows past n_q get L = +inf, which makes
    P exactly 0 there (their Q and dO rows read as zero), and D = 0."""
    in_q = offs_m < n_q
    lse = gl.load(L + pid_bh * n_q + offs_m, mask=in_q, other=float("inf"))
    delta = gl.load(Delta + pid_bh * n_q + offs_m, mask=in_q, other=0.0)
    return lse * 1.4426950408889634, delta


@gluon.jit
def _load_q_do(q_desc, do_desc, bar, q_buf, do_buf, off_b, off_h, row, pred, nbytes: gl.constexpr):
    """Start the TMA copies of one Q tile and one dO tile, both signalling `bar`."""
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [off_b, off_h, row, 0], bar, q_buf, pred=pred)
    tma.async_copy_global_to_shared(do_desc, [off_b, off_h, row, 0], bar, do_buf, pred=pred)


# ----------------------------------------------------------------------------- host side


@functools.cache
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def routed(kernel: str, head_dim: int) -> bool:
    """Whether `flash_attention_triton` sends `kernel` ("forward", "backward_dkdv",
    "backward_dq") at this head dim to these kernels (where they measured faster)."""
    return head_dim in CONFIGS[kernel]


def supported(*tensors: torch.Tensor) -> bool:
    """Whether these (batch, heads, n, d) tensors can go through the Hopper kernels."""
    x = tensors[0]
    if x.device.type != "cuda" or x.dtype not in GL_DTYPES or x.shape[-1] not in HEAD_DIMS:
        return False
    if not _is_hopper(x.device.index if x.device.index is not None else 0):
        return False
    for t in tensors:
        if t.dim() != 4 or t.dtype != x.dtype or t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            return False
    return True


def _descriptor(x: torch.Tensor, block_rows: int) -> TensorDescriptor:
    """A TMA descriptor over (batch, heads, n, d) with (1, 1, block_rows, d) tiles: rows past n
    read as zeros and are not written, per head."""
    block = [1, 1, block_rows, x.shape[-1]]
    dtype = gl.float32 if x.dtype == torch.float32 else GL_DTYPES[x.dtype]
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)


def _config(kernel: str, head_dim: int) -> tuple[int, int, int, int]:
    return CONFIGS[kernel].get(head_dim, DEFAULT_CONFIGS[kernel])


def chosen_config(kernel: str, head_dim: int) -> dict:
    """The tiles of `kernel` ("forward", "backward_dkdv", "backward_dq") in the form of
    `flash_attention_triton.chosen_configs()`."""
    config = _config(kernel, head_dim)
    block_m, block_n, warps, stages = config[:4]
    switches = config[4] if len(config) > 4 else {}
    return {
        "BLOCK_Q": block_m,
        "BLOCK_K": block_n,
        "num_warps": warps,
        "num_stages": stages,
        "use_desc": True,
        "autotuned": False,
        "kernel": "gluon",
        "warp_specialized": bool(switches.get("WS")),
    }


def _constants(head_dim, config, is_causal) -> dict:
    """Compile-time constants and launch options of `config`: (BLOCK_M, BLOCK_N, num_warps,
    STAGES), optionally followed by a dict of other switches (WS: the warp-specialized forward;
    A_IN_REGS: the dK/dV pass's K and V in registers)."""
    block_m, block_n, warps, stages = config[:4]
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_CAUSAL=bool(is_causal),
        STAGES=stages,
        num_warps=warps,
        **(config[4] if len(config) > 4 else {}),
    )


def _consumer_regs(block_m: int) -> int:
    """Registers per thread of each of the block_m / 64 consumer warpgroups of a
    warp-specialized kernel: what two or three warpgroups and the producer warp can share of an
    SM's 64K."""
    return 240 if block_m == 128 else 160


def _forward_call(q, k, v, o, lse, is_causal, config=None):
    """(kernel, grid, arguments, compile-time constants) of one forward launch."""
    b, h, n_q, d = q.shape
    config = config or _config("forward", d)
    block_m, block_n = config[:2]
    constants = _constants(d, config, is_causal)
    ws = constants.pop("WS", False)
    if ws:  # block_m / 64 consumer warpgroups of 64 rows each, and a producer warp
        constants = {"CONSUMER_REGS": _consumer_regs(block_m), **constants, "num_warps": 4}
    q_rows = 64 if ws else block_m
    args = dict(
        q_desc=_descriptor(q, q_rows),
        k_desc=_descriptor(k, block_n),
        v_desc=_descriptor(v, block_n),
        o_desc=_descriptor(o, q_rows),
        L=lse,
        n_heads=h,
        n_q=n_q,
        n_k=k.shape[2],
        qk_scale=LOG2E / math.sqrt(d),
    )
    grid = (b * h, triton.cdiv(n_q, block_m))
    return (_attn_fwd_ws_kernel if ws else _attn_fwd_kernel), grid, args, constants


def _dkdv_call(q, k, v, do, lse, delta, dk, dv, is_causal, config=None, dq=None):
    """(kernel, grid, arguments, compile-time constants) of one dK/dV launch; `dq` is the fp32
    tensor the FUSE_DQ configs add dQ into (unused otherwise)."""
    b, h, n_q, d = q.shape
    config = config or _config("backward_dkdv", d)
    block_m, block_n = config[:2]
    rows = dict(q_desc=(q, block_m), k_desc=(k, block_n), v_desc=(v, block_n))
    rows.update(do_desc=(do, block_m), dk_desc=(dk, block_n), dv_desc=(dv, block_n))
    rows.update(dq_desc=(dq if dq is not None else dk, block_m))
    constants = _constants(d, config, is_causal)
    ws = constants.pop("WS", False)
    if ws:  # two consumer warpgroups of block_n / 2 keys each, and a producer warp
        # (FUSE_DQ: and a dQ warpgroup, for which the consumers give up registers)
        regs = 216 if constants.get("FUSE_DQ") else 240
        constants = {
            "CONSUMER_REGS": regs,
            "DS_BUFS": 3,
            "DQ_REGS": 72,
            **constants,
            "num_warps": 4,
        }
        for name in ("k_desc", "v_desc", "dk_desc", "dv_desc"):
            rows[name] = (rows[name][0], block_n // 2)
    args = {name: _descriptor(x, r) for name, (x, r) in rows.items()}
    args.update(L=lse, Delta=delta, n_heads=h, n_q=n_q, n_k=k.shape[2])
    args.update(qk_scale=LOG2E / math.sqrt(d), sm_scale=1.0 / math.sqrt(d))
    grid = (b * h, triton.cdiv(k.shape[2], block_n))
    return (_attn_bwd_dkdv_ws_kernel if ws else _attn_bwd_dkdv_kernel), grid, args, constants


def _dq_call(q, k, v, do, lse, delta, dq, is_causal, config=None, o=None):
    """(kernel, grid, arguments, compile-time constants) of one dQ launch; with `o`, the pass
    computes D from O and dO and writes it into `delta`."""
    b, h, n_q, d = q.shape
    config = config or _config("backward_dq", d)
    block_m, block_n = config[:2]
    constants = _constants(d, config, is_causal)
    if not constants.pop("WS", False):
        raise ValueError(f"the Gluon dQ pass is warp-specialized: {config} lacks {{'WS': True}}")
    # block_m / 64 consumer warpgroups of 64 rows each, and a producer warp
    q_rows = 64
    rows = dict(q_desc=(q, q_rows), k_desc=(k, block_n), v_desc=(v, block_n))
    rows.update(do_desc=(do, q_rows), o_desc=(do if o is None else o, q_rows))
    rows.update(dq_desc=(dq, q_rows))
    args = {name: _descriptor(x, r) for name, (x, r) in rows.items()}
    args.update(L=lse, Delta=delta, n_heads=h, n_q=n_q, n_k=k.shape[2])
    args.update(qk_scale=LOG2E / math.sqrt(d), sm_scale=1.0 / math.sqrt(d))
    grid = (b * h, triton.cdiv(n_q, block_m))
    if o is not None:
        constants["DELTA"] = True
    constants = {"CONSUMER_REGS": _consumer_regs(block_m), **constants, "num_warps": 4}
    return _attn_bwd_dq_ws_kernel, grid, args, constants


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, config=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L (fp32, (batch, heads, n_q)) for 4-D inputs that `supported()` accepts.
    `config` = (BLOCK_M, BLOCK_N, num_warps, STAGES) overrides FORWARD_CONFIGS."""
    b, h, n_q, d = q.shape
    o = torch.empty((b, h, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    kernel, grid, args, constants = _forward_call(q, k, v, o, lse, is_causal, config)
    kernel[grid](**args, **constants)
    return o, lse


def fuses_dq(head_dim: int, config=None) -> bool:
    """Whether the dK/dV pass at this head dim (or `config`) also computes dQ (FUSE_DQ)."""
    config = config or _config("backward_dkdv", head_dim)
    return bool(len(config) > 4 and config[4].get("FUSE_DQ"))


def backward_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal: bool, config=None, dq=None) -> None:
    """dK and dV (written into `dk`, `dv`) for 4-D inputs that `supported()` accepts; `lse` and
    `delta` are (batch, heads, n_q) fp32, contiguous. `config` = (BLOCK_M, BLOCK_N, num_warps,
    STAGES[, switches]) overrides DKDV_CONFIGS. Where the config fuses dQ (`fuses_dq`), dQ is
    written into `dq` too (through an fp32 accumulator of Q's shape)."""
    d = q.shape[-1]
    acc = None
    if fuses_dq(d, config):
        if dq is None:
            raise ValueError("this dK/dV configuration computes dQ: pass `dq`")
        acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kernel, grid, args, constants = _dkdv_call(
        q, k, v, do, lse, delta, dk, dv, is_causal, config, dq=acc
    )
    kernel[grid](**args, **constants)
    if acc is not None:
        dq.copy_(acc)


def backward_dq(q, k, v, do, lse, delta, dq, is_causal: bool, config=None, o=None) -> None:
    """dQ (written into `dq`) for 4-D inputs that `supported()` accepts; `lse` and `delta` as
    for `backward_dkdv`. `config` = (BLOCK_M, BLOCK_N, num_warps, STAGES) overrides DQ_CONFIGS.
    With `o` (the forward's output), D = rowsum(O * dO) is computed here and written into
    `delta` (which then need not hold anything)."""
    kernel, grid, args, constants = _dq_call(q, k, v, do, lse, delta, dq, is_causal, config, o)
    kernel[grid](**args, **constants)
