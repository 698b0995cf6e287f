"""The Hopper dK/dV pass in one warpgroup per key tile (`_attn_bwd_dkdv_kernel`), in transposed
form (keys as rows; Q and dO tiles streamed through a TMA ring), optionally computing dQ too
(FUSE_DQ: added into an fp32 tensor by TMA reductions); and what the warp-specialized pass
(`backward_dkdv_ws`) shares with it: the query-tile step `dkdv_tile`, the last tile's
products, the loads of Q/dO tiles and of L and D, the dQ reduction."""

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

from cs336_systems.kernels.hopper.common import mma_layout, program_tile, tma_reduce_add


@gluon.jit
def dkdv_tile(
    i,
    lo_tile,
    k_first,
    ready,
    q_smem,
    do_smem,
    k_a,
    v_a,
    p_op,
    ds_op,
    dv,
    dk,
    lse_next,
    delta_next,
    st_init,
    offs_n,
    offs_mb,
    qk_scale,
    dq_operands,
    IS_CAUSAL: gl.constexpr,
    DQ: gl.constexpr,
):
    """Query tile i (of those from `lo_tile` on) of the dK/dV loop, in transposed form (keys as
    rows: this warpgroup's keys k_first + [0, BLOCK_N), offsets `offs_n`, held as the A operands
    `k_a`, `v_a`), as both dK/dV passes run it.

    Once Q_i and dO_i are in ring slot i % STAGES (`ready`), it issues S_i^T, dP_i^T and tile
    i - 1's dV and dK products (from that tile's P^T and dS^T, `p_op` and `ds_op`: zeros at
    i = 0, whose products then add 0 x Q_0 and 0 x dO_0), with DQ also tile i - 1's dQ product
    dS_{i-1} K (`dq_operands` = (dS^T buffer, K, zero accumulator)); waits for S_i^T only,
    computes P_i^T while the others run, waits for dP_i^T and computes dS_i^T while tile i - 1's
    products still run; then waits for everything. Every product issued here is waited for
    here: with products in flight across the loop's back edge, ptxas cannot follow the wgmma
    pipeline and makes every product synchronous (its "wgmma.mma_async instructions are
    serialized" note).

    Returns (dv, dk, tile i - 1's dQ (dk without DQ), P_i^T, dS_i^T in the input dtype, the ring
    slot of tile i - 1)."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = st_init.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    cols: gl.constexpr = offs_mb.type.layout
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
    if DQ:  # tile i - 1's dQ (zeros at i = 0)
        ds_prev, k, zero_acc = dq_operands
        dq = warpgroup_mma(ds_prev.permute((1, 0)), k, zero_acc, use_acc=False, is_async=True)
    lse = gl.convert_layout(lse_next, cols)
    delta = gl.convert_layout(delta_next, cols)
    s_t = warpgroup_mma_wait(4 if DQ else 3, deps=[s_t])
    p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
    if IS_CAUSAL:
        if (lo_tile + i) * BLOCK_M < k_first + BLOCK_N:
            causal = gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1)
            p_t = gl.where(causal, p_t, 0.0)
    dp_t = warpgroup_mma_wait(3 if DQ else 2, deps=[dp_t])
    ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
    p_lo = p_t.to(dtype)
    ds_lo = ds_t.to(dtype)
    # tile i - 1's products are done; p_lo and ds_lo pass through the wait so that their
    # packing into operand registers (which may be the in-flight operands' registers)
    # comes after it
    if DQ:
        dv, dk, dq, p_lo, ds_lo = warpgroup_mma_wait(0, deps=[dv, dk, dq, p_lo, ds_lo])
    else:
        dv, dk, p_lo, ds_lo = warpgroup_mma_wait(0, deps=[dv, dk, p_lo, ds_lo])
        dq = dk
    return dv, dk, dq, p_lo, ds_lo, older


@gluon.jit
def dkdv_last_tile(T, ready, q_smem, do_smem, p_op, ds_op, dv, dk):
    """Issue the last query tile's dV and dK products, after the loop of `dkdv_tile` (with
    T <= 0: zeros times tile 0, which is loaded regardless); the caller waits for them."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    last = gl.maximum(T - 1, 0)
    mbarrier.wait(ready.index(last % STAGES), (last // STAGES) & 1)
    q_t = q_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_smem.index(last % STAGES).reshape([BLOCK_M, HEAD_DIM])
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
    return dv, dk


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
    HEADS_TOGETHER: gl.constexpr = 0,
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
    st_layout: gl.constexpr = mma_layout(num_warps, BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(num_warps, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    cols: gl.constexpr = gl.SliceLayout(0, st_layout)
    rows: gl.constexpr = gl.SliceLayout(1, st_layout)

    # grid (batch x heads, key tiles); causal: key tile 0 sees every query, so ascending order
    # launches the heaviest programs first
    pid_bh, k_tile = program_tile(HEADS_TOGETHER)
    k0 = k_tile * BLOCK_N
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
        load_q_do(
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
    lse_next, delta_next = load_rows_stats(L, Delta, pid_bh, n_q, lo_tile * BLOCK_M + offs_flat)
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

    if FUSE_DQ:  # tile i - 1's dQ product: dS_{i-1}^T from shared memory times K
        dq_operands = (ds_smem, k, acc_init)
    else:
        dq_operands = (acc_init,)
    for i in range(T):
        dv, dk, dq, p_lo, ds_lo, older = dkdv_tile(
            i,
            lo_tile,
            k0,
            bars,
            q_smem,
            do_smem,
            k_a,
            v_a,
            p_op,
            ds_op,
            dv,
            dk,
            lse_next,
            delta_next,
            st_init,
            offs_n,
            offs_mb,
            qk_scale,
            dq_operands,
            IS_CAUSAL,
            FUSE_DQ,
        )
        if FUSE_DQ:
            row = (lo_tile + gl.maximum(i - 1, 0)) * BLOCK_M  # tile 0's rows (+ 0) at i = 0
            reduce_dq(dq_desc, dq_smem.index(i % 2), dq * sm_scale, [off_b, off_h, row, 0])
            # dS_i^T for the next iteration's dQ product (read after the barrier below)
            ds_smem.store(ds_lo)
            fence_async_shared()
        p_op = gl.convert_layout(p_lo, op_layout)
        ds_op = gl.convert_layout(ds_lo, op_layout)
        # tile i - 1's Q and dO buffers are free: they take tile i - 1 + STAGES
        gl.thread_barrier()
        prev_stage = (i + STAGES - 1) % STAGES
        load_q_do(
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
        lse_next, delta_next = load_rows_stats(
            L, Delta, pid_bh, n_q, (lo_tile + i + 1) * BLOCK_M + offs_flat
        )

    dv, dk = dkdv_last_tile(T, bars, q_smem, do_smem, p_op, ds_op, dv, dk)
    if FUSE_DQ:
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k, acc_init, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
        if T > 0:
            row = (lo_tile + T - 1) * BLOCK_M
            reduce_dq(dq_desc, dq_smem.index(T % 2), dq * sm_scale, [off_b, off_h, row, 0])
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
def reduce_dq(dq_desc, buf, dq, coord, PENDING: gl.constexpr = 1):
    """Add the fp32 tile `dq` into the rows of `dq_desc` at `coord` by a TMA reduction through
    `buf`, one of PENDING + 1 buffers used in turn (the reduction that read it before is waited
    for: at most PENDING others stay in flight)."""
    tma.store_wait(PENDING)
    gl.thread_barrier()
    buf.reshape([dq_desc.block_type.shape[2], dq_desc.block_type.shape[3]]).store(dq)
    fence_async_shared()
    gl.thread_barrier()
    tma_reduce_add(dq_desc, coord, buf)


@gluon.jit
def load_rows_stats(L, Delta, pid_bh, n_q, offs_m):
    """L (in log2 units) and D of query rows `offs_m`; rows past n_q get L = +inf, which makes
    P exactly 0 there (their Q and dO rows read as zero), and D = 0."""
    in_q = offs_m < n_q
    lse = gl.load(L + pid_bh * n_q + offs_m, mask=in_q, other=float("inf"))
    delta = gl.load(Delta + pid_bh * n_q + offs_m, mask=in_q, other=0.0)
    return lse * 1.4426950408889634, delta


@gluon.jit
def load_q_do(q_desc, do_desc, bar, q_buf, do_buf, off_b, off_h, row, pred, nbytes: gl.constexpr):
    """Start the TMA copies of one Q tile and one dO tile, both signalling `bar`."""
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [off_b, off_h, row, 0], bar, q_buf, pred=pred)
    tma.async_copy_global_to_shared(do_desc, [off_b, off_h, row, 0], bar, do_buf, pred=pred)
