"""The warp-specialized Hopper dK/dV pass (`_attn_bwd_dkdv_ws_kernel`): a producer warp and two
consumer warpgroups of BLOCK_N / 2 keys sharing each Q and dO tile, each running the query-tile
step of the one-warpgroup pass (`backward_dkdv.dkdv_tile`), or with SERIAL one that waits for
each tile's products within the tile (`dkdv_tile_serial`). FUSE_DQ: dQ too, added into an fp32
tensor by TMA reductions, by a third warpgroup from the consumers' dS tiles, or with SERIAL by
the consumers themselves, half of dQ's columns each."""

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

from cs336_systems.kernels.hopper.backward_dkdv import (
    dkdv_last_tile,
    dkdv_tile,
    load_q_do,
    load_rows_stats,
    reduce_dq,
)
from cs336_systems.kernels.hopper.common import mma_layout, program_tile


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
        load_q_do(
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
    SERIAL: gl.constexpr,
):
    """One consumer warpgroup (C: 0 or 1) of the warp-specialized dK/dV pass: keys
    kc + [0, BLOCK_N), whose K and V tiles are in `k_buf`, `v_buf`, through the loop of
    `_attn_bwd_dkdv_kernel`, each Q and dO slot released through an mbarrier once this
    warpgroup's products have read it; its warps never wait for the other warpgroup. `tile`
    holds what both consumers share. FUSE_DQ: each dS_i^T also goes into a ring of shared-memory
    buffers for the dQ warpgroup (`_dkdv_dq_worker`). SERIAL: each query tile's products are
    waited for within the tile (`dkdv_tile_serial`), which keeps fewer accumulators live."""
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
        if SERIAL:
            ds_smem, ds_ready, ds_free, fin, dq_smem, dq_desc, k_smem = fused
        else:
            ds_smem, ds_ready, ds_free, fin = fused
    BLOCK_N: gl.constexpr = k_buf.shape[2]
    HEAD_DIM: gl.constexpr = k_buf.shape[3]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    dtype: gl.constexpr = k_buf.dtype
    st_layout: gl.constexpr = mma_layout(4, BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(4, HEAD_DIM)
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
    lse_next, delta_next = load_rows_stats(L, Delta, pid_bh, n_q, lo_tile * BLOCK_M + offs_flat)
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

    if SERIAL:
        if FUSE_DQ:  # this warpgroup's half of dQ's columns, from both halves of the keys
            DQ_COLS: gl.constexpr = dq_desc.block_type.shape[3]
            dq_layout: gl.constexpr = mma_layout(4, DQ_COLS)
            dq_init = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, dq_layout)
            k_lo = k_smem.index(0).reshape([BLOCK_N, HEAD_DIM]).slice(C * DQ_COLS, DQ_COLS, dim=1)
            k_hi = k_smem.index(1).reshape([BLOCK_N, HEAD_DIM]).slice(C * DQ_COLS, DQ_COLS, dim=1)
            NB: gl.constexpr = ds_smem.shape[0] // 2
        for i in range(T):
            dv, dk, ds_lo = dkdv_tile_serial(
                i,
                lo_tile,
                kc,
                ready,
                q_smem,
                do_smem,
                k_a,
                v_a,
                dv,
                dk,
                lse_next,
                delta_next,
                st_init,
                offs_n,
                offs_mb,
                qk_scale,
                op_layout,
                IS_CAUSAL,
            )
            if FUSE_DQ:
                # dV_i and dK_i are in flight: dS_i^T into the ring, then tile i - 1's dQ
                # product (both warpgroups' dS^T of that tile are in by now, or soon)
                _ds_in(ds_smem, ds_free, ds_ready, ds_lo, i, C)
                if i >= 1:
                    dq = _dq_half(ds_smem, ds_ready, i - 1, k_lo, k_hi, dq_init)
                    dv_done, dk_done, dq = warpgroup_mma_wait(0, deps=[dv, dk, dq])
                    mbarrier.arrive(ds_free.index((i - 1) % NB), count=1)
                    row = (lo_tile + i - 1) * BLOCK_M
                    coord = [off_b, off_h, row, C * DQ_COLS]
                    reduce_dq(dq_desc, dq_smem.index(C), dq * sm_scale, coord, 0)
                else:
                    dv_done, dk_done = warpgroup_mma_wait(0, deps=[dv, dk])
                dv = dv_done
                dk = dk_done
            else:
                dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
            # tile i's Q and dO slot is read by none of this warpgroup's products any more
            mbarrier.arrive(empty.index(i % q_smem.shape[0]), count=1)
            lse_next, delta_next = load_rows_stats(
                L, Delta, pid_bh, n_q, (lo_tile + i + 1) * BLOCK_M + offs_flat
            )
        if T <= 0:  # the producer loads tile 0 regardless: no copy outlives the program
            mbarrier.wait(ready.index(0), 0)
        if FUSE_DQ:
            if T >= 1:  # the last tile's dQ
                dq = _dq_half(ds_smem, ds_ready, T - 1, k_lo, k_hi, dq_init)
                dq = warpgroup_mma_wait(0, deps=[dq])
                row = (lo_tile + T - 1) * BLOCK_M
                coord = [off_b, off_h, row, C * DQ_COLS]
                reduce_dq(dq_desc, dq_smem.index(C), dq * sm_scale, coord, 0)
            tma.store_wait(0)
            # both warpgroups' dQ products read both halves of K: neither overwrites its half
            # with dK before the other's last product is done
            mbarrier.arrive(fin, count=1)
            mbarrier.wait(fin, 0)
    else:
        for i in range(T):
            dv, dk, _, p_lo, ds_lo, older = dkdv_tile(
                i,
                lo_tile,
                kc,
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
                (acc_init,),
                IS_CAUSAL,
                False,
            )
            if FUSE_DQ:
                _ds_in(ds_smem, ds_free, ds_ready, ds_lo, i, C)
            # tile i - 1's Q and dO slot is read by neither of this warpgroup's products any more
            if i >= 1:
                mbarrier.arrive(empty.index(older), count=1)
            p_op = gl.convert_layout(p_lo, op_layout)
            ds_op = gl.convert_layout(ds_lo, op_layout)
            lse_next, delta_next = load_rows_stats(
                L, Delta, pid_bh, n_q, (lo_tile + i + 1) * BLOCK_M + offs_flat
            )
        dv, dk = dkdv_last_tile(T, ready, q_smem, do_smem, p_op, ds_op, dv, dk)
        dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
    if FUSE_DQ:
        if not SERIAL:  # the dQ warpgroup's products no longer read K
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
def dkdv_tile_serial(
    i,
    lo_tile,
    k_first,
    ready,
    q_smem,
    do_smem,
    k_a,
    v_a,
    dv,
    dk,
    lse_next,
    delta_next,
    st_init,
    offs_n,
    offs_mb,
    qk_scale,
    op_layout: gl.constexpr,
    IS_CAUSAL: gl.constexpr,
):
    """Query tile i of the dK/dV loop with its products in order: S_i^T and dP_i^T, then P_i^T
    and dS_i^T, then dV += P_i^T dO_i and dK += dS_i^T Q_i from registers, issued and left in
    flight: the caller waits for them in the same iteration (with the fused dQ product of tile
    i - 1 beside them). Unlike `dkdv_tile`, no product of tile i - 1 is in flight beside S_i^T
    and dP_i^T, so the
    score tiles and the dK, dV accumulators are never live with the previous tile's operands:
    at d = 128 and 64 queries per tile that is what fits in a consumer's registers (the other
    consumer warpgroup keeps the tensor cores busy meanwhile). Returns (dv, dk, dS_i^T)."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[3]
    HEAD_DIM: gl.constexpr = q_smem.shape[4]
    BLOCK_N: gl.constexpr = st_init.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    cols: gl.constexpr = offs_mb.type.layout
    stage = i % STAGES
    offs_m = (lo_tile + i) * BLOCK_M + offs_mb
    mbarrier.wait(ready.index(stage), (i // STAGES) & 1)
    q_t = q_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
    do_t = do_smem.index(stage).reshape([BLOCK_M, HEAD_DIM])
    s_t = warpgroup_mma(k_a, q_t.permute((1, 0)), st_init, use_acc=False, is_async=True)
    dp_t = warpgroup_mma(v_a, do_t.permute((1, 0)), st_init, use_acc=False, is_async=True)
    lse = gl.convert_layout(lse_next, cols)
    delta = gl.convert_layout(delta_next, cols)
    s_t = warpgroup_mma_wait(1, deps=[s_t])
    p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse, 0))
    if IS_CAUSAL:
        if (lo_tile + i) * BLOCK_M < k_first + BLOCK_N:
            causal = gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1)
            p_t = gl.where(causal, p_t, 0.0)
    dp_t = warpgroup_mma_wait(0, deps=[dp_t])
    ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
    ds_lo = ds_t.to(dtype)
    p_op = gl.convert_layout(p_t.to(dtype), op_layout)
    ds_op = gl.convert_layout(ds_lo, op_layout)
    dv = warpgroup_mma(p_op, do_t, dv, is_async=True)
    dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
    return dv, dk, ds_lo


@gluon.jit
def _dq_half(ds_smem, ds_ready, t, k_lo, k_hi, dq_init):
    """A SERIAL consumer's half of dQ_t = dS_t K: once both consumers' dS_t^T are in ring
    buffer t % NB, the products over both halves of the keys (`k_lo`, `k_hi`: K's rows of each
    consumer, sliced to this warpgroup's columns), issued and left in flight."""
    NB: gl.constexpr = ds_smem.shape[0] // 2
    b = t % NB
    mbarrier.wait(ds_ready.index(b), (t // NB) & 1)
    dq = warpgroup_mma(
        ds_smem.index(2 * b).permute((1, 0)), k_lo, dq_init, use_acc=False, is_async=True
    )
    return warpgroup_mma(ds_smem.index(2 * b + 1).permute((1, 0)), k_hi, dq, is_async=True)


@gluon.jit
def _ds_in(ds_smem, ds_free, ds_ready, ds_lo, i, C: gl.constexpr):
    """Consumer C's dS_i^T into ring buffer i % NB, once the dQ products of the tile that used
    the buffer before are done; then signal `ds_ready` (both consumers)."""
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
    # a layout passed straight into a @jit helper must be a constexpr: named here it is one
    # (unnamed, Triton 3.6 flattened it as a value on the CPU machine of 2026-11-25, where the
    # sm_90 compile test failed; the GPU host compiled it either way)
    dq_layout: gl.constexpr = mma_layout(4, HEAD_DIM)
    dq_init = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
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
        reduce_dq(dq_desc, dq_smem.index(t % 2), dq * sm_scale, [off_b, off_h, row, 0])
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
    SERIAL: gl.constexpr = False,
    HEADS_TOGETHER: gl.constexpr = 0,
):
    """The dK/dV pass with warp specialization: one producer warp issues the TMA copies; two
    consumer warpgroups, each in its own partition, own BLOCK_N / 2 keys each and share every
    Q and dO tile (loaded once for both), never waiting for each other. Launched with
    num_warps=4 (the default partition is the first consumer). FUSE_DQ: a third warpgroup
    (DQ_REGS registers) computes dQ from the consumers' dS tiles (DS_BUFS of them in a ring)
    into the fp32 tensor of `dq_desc`, which starts at zero (`_dkdv_dq_worker`). SERIAL: the
    consumers wait for each query tile's products within the tile (`dkdv_tile_serial`)."""
    dtype: gl.constexpr = q_desc.dtype
    HALF: gl.constexpr = BLOCK_N // 2
    # where dQ is computed: by a third warpgroup, or (SERIAL) by the consumers
    DQ_WG: gl.constexpr = FUSE_DQ and not SERIAL
    SERIAL_DQ: gl.constexpr = FUSE_DQ and SERIAL
    pid_bh, k_tile = program_tile(HEADS_TOGETHER)
    k0 = k_tile * BLOCK_N
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
    if SERIAL_DQ:  # the consumers compute dQ themselves, half its columns each
        gl.static_assert(HALF == BLOCK_M, "dS^T tiles of 64 keys x 64 queries")
        # tile i's dS^T goes in before tile i - 1's dQ products release theirs
        gl.static_assert(DS_BUFS >= 2, "SERIAL with FUSE_DQ needs two dS^T buffers or more")
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
            mbarrier.init(ds_free.index(b), count=2)  # both consumers' dQ products read it
        mbarrier.init(fin, count=2)
        fused = (ds_smem, ds_ready, ds_free, fin, dq_smem, dq_desc, k_smem)
    elif DQ_WG:
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
    if DQ_WG:
        dq_args = (k_smem, ds_smem, dq_smem, kv_bar, ds_ready, ds_free, fin, dq_desc, off_b, off_h)
        gl.warp_specialize(
            [
                (
                    _dkdv_consumer,
                    (
                        k0,
                        k_smem.index(0),
                        v_smem.index(0),
                        tile,
                        IS_CAUSAL,
                        A_IN_REGS,
                        0,
                        True,
                        SERIAL,
                    ),
                ),
                (
                    _dkdv_consumer,
                    (k0 + HALF, k_1, v_1, tile, IS_CAUSAL, A_IN_REGS, 1, True, SERIAL),
                ),
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
                    (
                        k0,
                        k_smem.index(0),
                        v_smem.index(0),
                        tile,
                        IS_CAUSAL,
                        A_IN_REGS,
                        0,
                        FUSE_DQ,
                        SERIAL,
                    ),
                ),
                (
                    _dkdv_consumer,
                    (k0 + HALF, k_1, v_1, tile, IS_CAUSAL, A_IN_REGS, 1, FUSE_DQ, SERIAL),
                ),
                (_dkdv_loader, loads),
            ],
            [4, 1],
            [CONSUMER_REGS, 24],
        )
