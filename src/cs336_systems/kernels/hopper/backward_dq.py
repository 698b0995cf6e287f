"""The Hopper dQ pass, warp-specialized (`_attn_bwd_dq_ws_kernel`): a producer warp and two or
three consumer warpgroups of 64 query rows sharing each K and V tile; optionally computing
D = rowsum(O * dO) of its rows itself (DELTA)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from cs336_systems.kernels.hopper.common import (
    kv_ring_barriers,
    load_kv_ring,
    mask_scores,
    mma_layout,
    query_tile,
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
    load_kv_ring(k_desc, v_desc, k_smem, v_smem, bars, off_b, off_h, n_tiles)


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
    s_layout: gl.constexpr = mma_layout(4, BLOCK_N)
    acc_layout: gl.constexpr = mma_layout(4, HEAD_DIM)
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
            s = mask_scores(s, offs_m, j * BLOCK_N + offs_nb, n_k, IS_CAUSAL)
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
    HEADS_TOGETHER: gl.constexpr = 0,
):
    """The dQ pass with warp specialization: one producer warp issues the TMA copies; BLOCK_M /
    64 (2 or 3) consumer warpgroups of 64 query rows each, in their own partitions, share every
    K and V tile (loaded once for all) and never wait for each other. Launched with num_warps=4
    (the default partition is the first consumer)."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    NC: gl.constexpr = BLOCK_M // ROWS
    gl.static_assert((NC == 2) | (NC == 3), "two or three consumer warpgroups")
    pid_bh, off_b, off_h, q0, n_tiles, first_masked = query_tile(
        n_heads, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL, HEADS_TOGETHER
    )

    q_smem = gl.allocate_shared_memory(dtype, [NC] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NC] + do_desc.block_type.shape, do_desc.layout)
    if DELTA:
        o_smem = gl.allocate_shared_memory(dtype, [NC] + o_desc.block_type.shape, o_desc.layout)
    else:
        o_smem = q_smem
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    bars = kv_ring_barriers(STAGES, NC)
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
