"""The Hopper forward kernels: one CTA in lockstep (`_attn_fwd_kernel`) and warp-specialized
(`_attn_fwd_ws_kernel`: a producer warp and two or three consumer warpgroups, optionally taking
turns to issue their products)."""

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
    load_kv,
    load_kv_ring,
    mask_scores,
    mma_layout,
    query_tile,
)


@gluon.jit
def _softmax_update(s, m_i, l_i, qk_scale):
    """Online softmax over one tile of raw scores: new running max (scaled, log2 units),
    unnormalised probabilities, running sum and the factor that rescales what came before."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


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
    HEADS_TOGETHER: gl.constexpr = 0,
):
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = mma_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = mma_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid_bh, off_b, off_h, q0, n_tiles, first_masked = query_tile(
        n_heads, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL, HEADS_TOGETHER
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
        load_kv(k_desc, k_bars.index(i), k_smem.index(i), off_b, off_h, i, n_tiles, BLOCK_N)
        load_kv(v_desc, v_bars.index(i), v_smem.index(i), off_b, off_h, i, n_tiles, BLOCK_N)

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
        s = mask_scores(s, offs_m, offs_nb, n_k, IS_CAUSAL)
    p, m_i, l_i, alpha = _softmax_update(s, m_i, l_i, qk_scale)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    # K_0 is consumed (by every warpgroup): its buffer takes K_STAGES
    gl.thread_barrier()
    load_kv(k_desc, k_bars.index(0), k_smem.index(0), off_b, off_h, STAGES, n_tiles, BLOCK_N)

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
            s = mask_scores(s, offs_m, j * BLOCK_N + offs_nb, n_k, IS_CAUSAL)
        p, m_i, l_i, alpha = _softmax_update(s, m_i, l_i, qk_scale)
        # p_op is read from registers by the product in flight: it stays alive until the wait
        acc, p_op = warpgroup_mma_wait(0, deps=[acc, p_op])
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # K_j and V_{j-1} are consumed (by every warpgroup): refill their buffers
        gl.thread_barrier()
        load_kv(
            k_desc,
            k_bars.index(stage),
            k_smem.index(stage),
            off_b,
            off_h,
            j + STAGES,
            n_tiles,
            BLOCK_N,
        )
        load_kv(
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
    load_kv_ring(k_desc, v_desc, k_smem, v_smem, bars, off_b, off_h, n_tiles)


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
    s_layout: gl.constexpr = mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = mma_layout(4, HEAD_DIM)
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
        s = mask_scores(s, offs_m, offs_nb, n_k, IS_CAUSAL)
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
            s = mask_scores(s, offs_m, j * BLOCK_N + offs_nb, n_k, IS_CAUSAL)
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
    HEADS_TOGETHER: gl.constexpr = 0,
):
    """The forward with warp specialization (FlashAttention-3's): one producer warp issues the
    TMA copies of Q, K and V; BLOCK_M / 64 (2 or 3) consumer warpgroups, each in its own
    partition, compute 64 query rows each and never wait for each other.
    Launched with num_warps=4 (the default partition is the first consumer)."""
    dtype: gl.constexpr = q_desc.dtype
    ROWS: gl.constexpr = q_desc.block_type.shape[2]
    NC: gl.constexpr = BLOCK_M // ROWS
    gl.static_assert((NC == 2) | (NC == 3), "two or three consumer warpgroups")
    pid_bh, off_b, off_h, q0, n_tiles, first_masked = query_tile(
        n_heads, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL, HEADS_TOGETHER
    )

    q_smem = gl.allocate_shared_memory(dtype, [NC] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    turn = gl.allocate_shared_memory(gl.int64, [NC, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NC):
        mbarrier.init(turn.index(c), count=1)
    bars = kv_ring_barriers(STAGES, NC)
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
