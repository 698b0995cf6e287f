"""Gluon helpers shared by the Hopper kernels: the wgmma accumulator layout, score masking, TMA
copies of K/V tiles and their ring of mbarriers (the warp-specialized kernels' producer side),
a query tile's place in the grid, and the TMA bulk reduction Triton 3.6's Gluon lacks a
wrapper for."""

from __future__ import annotations

from triton._C.libtriton import ir as _ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
)


@gluon.constexpr_function
def mma_layout(num_warps, n):
    """wgmma accumulator layout of a (BLOCK_M x n) tile: warps stacked along the rows, 16 rows
    each (a warpgroup covers 64 rows)."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16]
    )


@gluon.jit
def mask_scores(s, offs_m, offs_n, n_k, IS_CAUSAL: gl.constexpr):
    """-inf where the key is past n_k or (causal) after the query."""
    valid = gl.expand_dims(offs_n, 0) < n_k
    if IS_CAUSAL:
        valid = valid & (gl.expand_dims(offs_m, 1) >= gl.expand_dims(offs_n, 0))
    return gl.where(valid, s, float("-inf"))


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the global tile of `tensor_desc` at `coord` (a TMA
    bulk tensor reduction, cp.reduce.async.bulk.tensor; rows out of bounds are skipped); waited
    for by `tma.store_wait` like a TMA store. Triton 3.6's Gluon has the op but no wrapper."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        _ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


@gluon.jit
def load_kv(desc, bar, smem, off_b, off_h, tile, n_tiles, BLOCK_N: gl.constexpr):
    """Start the TMA copy of key/value tile `tile` (if it exists) into `smem`, signalling `bar`."""
    pred = tile < n_tiles
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [off_b, off_h, tile * BLOCK_N, 0], bar, smem, pred=pred)


@gluon.jit
def kv_ring_barriers(STAGES: gl.constexpr, NC: gl.constexpr):
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
def load_kv_ring(k_desc, v_desc, k_smem, v_smem, bars, off_b, off_h, n_tiles):
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
        load_kv(
            k_desc, k_ready.index(stage), k_smem.index(stage), off_b, off_h, j, n_tiles, BLOCK_N
        )
        mbarrier.wait(v_empty.index(stage), free)
        load_kv(
            v_desc, v_ready.index(stage), v_smem.index(stage), off_b, off_h, j, n_tiles, BLOCK_N
        )


@gluon.jit
def program_tile(HEADS_TOGETHER: gl.constexpr):
    """This program's (batch x head index, tile index) on a (batch x heads, tiles) grid. The
    hardware launches programs with program_id(0) fastest, so as the grid says (HEADS_TOGETHER
    0) every head's tile t starts before any head's tile t + 1, and the programs in flight read
    and write every head's rows at once. With HEADS_TOGETHER = g the launch order is renumbered:
    g heads at a time run all their tiles (tile 0 of each of the g, then tile 1, ...), so the
    programs in flight share g heads' rows in L2; the last group may hold fewer heads."""
    if not HEADS_TOGETHER:
        bh = gl.program_id(0)
        tile = gl.program_id(1)
    else:
        n_bh = gl.num_programs(0)
        launched = gl.program_id(1) * n_bh + gl.program_id(0)
        per_group = gl.num_programs(1) * HEADS_TOGETHER
        group = launched // per_group
        first = group * HEADS_TOGETHER
        left = n_bh - first
        size = gl.where(left < HEADS_TOGETHER, left, HEADS_TOGETHER)
        within = launched - group * per_group
        bh = first + within % size
        tile = within // size
    return bh, tile


@gluon.jit
def query_tile(
    n_heads,
    n_k,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
    HEADS_TOGETHER: gl.constexpr,
):
    """Where a forward program works, on a (batch x heads, query tiles) grid with, under causal
    masking, the heaviest query tiles first: its (batch x head) index, batch, head, first query
    row, and its key tiles [0, n_tiles), of which those from first_masked on cross the diagonal
    or the ragged end. HEADS_TOGETHER: the launch order (`program_tile`)."""
    pid_bh, tile = program_tile(HEADS_TOGETHER)
    if IS_CAUSAL:
        pid_m = gl.num_programs(1) - 1 - tile
    else:
        pid_m = tile
    q0 = pid_m * BLOCK_M
    if IS_CAUSAL:
        hi = gl.minimum(n_k, q0 + BLOCK_M)
        first_masked = gl.minimum(q0, n_k) // BLOCK_N
    else:
        hi = n_k
        first_masked = n_k // BLOCK_N
    return pid_bh, pid_bh // n_heads, pid_bh % n_heads, q0, gl.cdiv(hi, BLOCK_N), first_masked
