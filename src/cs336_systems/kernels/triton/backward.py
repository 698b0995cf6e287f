"""The Triton-language backward kernels: D = rowsum(O * dO) (`_attn_bwd_preprocess`), then a
key-tile pass (`_attn_bwd_dkdv`: dK, dV; each program owns a K/V tile and walks over query
tiles; with FUSE_DQ it also adds each tile's dQ into an fp32 accumulator) and a query-tile pass
(`_attn_bwd_dq`: each program owns a Q tile and walks over key tiles), both recomputing
P = exp(S - L). No (n x n) buffer; no atomics unless dQ is fused."""

from __future__ import annotations

import triton
import triton.language as tl

from cs336_systems.kernels.triton.common import (
    NOT_SPECIALIZED,
    key_range,
    load_rows,
    load_tile,
    store_tile,
    tile_index,
    tile_source,
)


@triton.jit(do_not_specialize=["n_heads", "n_q"])
def _attn_bwd_preprocess(
    O,
    DO,
    Delta,
    DQ_ACC,
    stride_ob,
    stride_oh,
    stride_on,
    stride_od,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dod,
    n_heads,
    n_q,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    ZERO_DQ: tl.constexpr,
):
    """D = rowsum(O * dO) in fp32, one row per query; grid (batch x heads, query tiles). With
    ZERO_DQ, also zero the same rows of DQ_ACC (fp32, contiguous (batch, heads, n_q, d)): the
    accumulator a dK/dV pass that computes dQ adds into, without a fill launch of its own."""
    pid_bh = tl.program_id(0)
    pid_q = tl.program_id(1)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D_PAD)
    o_base = O + off_b * stride_ob + off_h * stride_oh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    o = load_rows(
        o_base + offs_q[:, None] * stride_on + offs_d[None, :] * stride_od,
        offs_q,
        n_q,
        offs_d,
        HEAD_DIM,
        D_PAD,
        True,
    )
    do = load_rows(
        do_base + offs_q[:, None] * stride_don + offs_d[None, :] * stride_dod,
        offs_q,
        n_q,
        offs_d,
        HEAD_DIM,
        D_PAD,
        True,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + pid_bh.to(tl.int64) * n_q + offs_q, delta, mask=offs_q < n_q)
    if ZERO_DQ:
        rows = pid_bh.to(tl.int64) * n_q + offs_q
        keep = (offs_q < n_q)[:, None] & (offs_d < HEAD_DIM)[None, :]
        zeros = tl.zeros((BLOCK_Q, D_PAD), dtype=tl.float32)
        tl.store(DQ_ACC + rows[:, None] * HEAD_DIM + offs_d[None, :], zeros, mask=keep)


@triton.jit
def _dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_src,
    do_src,
    dq_dst,
    l_base,
    delta_base,
    stride_qn,
    stride_qd,
    stride_don,
    stride_dod,
    stride_dqn,
    stride_dqd,
    offs_k,
    offs_d,
    start,
    stop,
    n_q,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_DESC: tl.constexpr,
    FUSE_DQ: tl.constexpr,
):
    """dV += P^T dO, dK += dS^T Q over query tiles [start, stop), transposed (the key tile's
    keys are rows), so no (BLOCK_Q x BLOCK_K) transpose is needed. With FUSE_DQ each tile's
    share of dQ (scale * dS K) is added to an fp32 accumulator: a bulk tensor reduction (TMA)
    with descriptors, relaxed atomics otherwise."""
    offs_qb = tl.arange(0, BLOCK_Q)
    for start_q in range(start, stop, BLOCK_Q):
        offs_q = start_q + offs_qb
        q = load_tile(
            q_src,
            start_q,
            offs_q,
            n_q,
            stride_qn,
            stride_qd,
            offs_d,
            HEAD_DIM,
            D_PAD,
            MASKED,
            USE_DESC,
        )
        if MASKED:
            in_q = offs_q < n_q
            lse = tl.load(l_base + offs_q, mask=in_q, other=0.0)
            delta = tl.load(delta_base + offs_q, mask=in_q, other=0.0)
        else:
            lse = tl.load(l_base + offs_q)
            delta = tl.load(delta_base + offs_q)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_K, BLOCK_Q)
        p_t = tl.exp2(s_t * qk_scale - lse[None, :] * 1.4426950408889634)
        if MASKED:
            valid = in_q[None, :]
            if IS_CAUSAL:
                valid = valid & (offs_q[None, :] >= offs_k[:, None])
            p_t = tl.where(valid, p_t, 0.0)
        do = load_tile(
            do_src,
            start_q,
            offs_q,
            n_q,
            stride_don,
            stride_dod,
            offs_d,
            HEAD_DIM,
            D_PAD,
            MASKED,
            USE_DESC,
        )
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=PRECISION)
        if FUSE_DQ:
            dq = tl.dot(tl.trans(ds_t), k, input_precision=PRECISION) * sm_scale
            if USE_DESC:
                dq_dst.atomic_add([start_q, 0], dq)
            else:
                dq_mask = offs_q[:, None] < n_q
                if D_PAD != HEAD_DIM:
                    dq_mask = dq_mask & (offs_d[None, :] < HEAD_DIM)
                dq_ptrs = dq_dst + offs_q[:, None] * stride_dqn + offs_d[None, :] * stride_dqd
                tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")
    return dk, dv


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DK,
    DV,
    DQ,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dod,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    stride_dvd,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    stride_dqd,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    sm_scale,
    N_Q_BUCKET,
    N_K_BUCKET,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_DESC: tl.constexpr,
    FUSE_DQ: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """dV = P^T dO and dK = scale * dS^T Q for one key tile, over all query tiles that see it
    (and with FUSE_DQ, dQ added into DQ, an fp32 accumulator). Grid (batch x heads, key
    tiles); under causal masking key tile 0 has the most work and is launched first."""
    pid_bh = tl.program_id(0)
    pid_k = tl.program_id(1)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    q_src = tile_source(
        Q + off_b * stride_qb + off_h * stride_qh, n_q, stride_qn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    do_src = tile_source(
        DO + off_b * stride_dob + off_h * stride_doh, n_q, stride_don, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    k_src = tile_source(
        K + off_b * stride_kb + off_h * stride_kh, n_k, stride_kn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    v_src = tile_source(
        V + off_b * stride_vb + off_h * stride_vh, n_k, stride_vn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dk_dst = tile_source(
        DK + off_b * stride_dkb + off_h * stride_dkh, n_k, stride_dkn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dv_dst = tile_source(
        DV + off_b * stride_dvb + off_h * stride_dvh, n_k, stride_dvn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dq_dst = tile_source(
        DQ + off_b * stride_dqb + off_h * stride_dqh, n_q, stride_dqn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    l_base = L + pid_bh.to(tl.int64) * n_q
    delta_base = Delta + pid_bh.to(tl.int64) * n_q

    k0 = pid_k * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, D_PAD)
    k = load_tile(
        k_src, k0, offs_k, n_k, stride_kn, stride_kd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    v = load_tile(
        v_src, k0, offs_k, n_k, stride_vn, stride_vd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    dk = tl.zeros([BLOCK_K, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_K, D_PAD], dtype=tl.float32)

    # query tiles: [lo, mid) cross the diagonal (masked), [mid, full_end) see every key of the
    # tile (no masks at all), [full_end, n_q) is the ragged last tile (masked)
    full_end = (n_q // BLOCK_Q) * BLOCK_Q
    if IS_CAUSAL:
        # query tiles whose rows all precede k0 see none of these keys
        lo = (k0 // BLOCK_Q) * BLOCK_Q
        mid = tl.maximum(lo, tl.minimum(full_end, tl.cdiv(k0 + BLOCK_K, BLOCK_Q) * BLOCK_Q))
    else:
        lo = 0
        mid = 0
    for part in tl.static_range(3):
        dk, dv = _dkdv_inner(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            dq_dst,
            l_base,
            delta_base,
            stride_qn,
            stride_qd,
            stride_don,
            stride_dod,
            stride_dqn,
            stride_dqd,
            offs_k,
            offs_d,
            lo if part == 0 else (mid if part == 1 else tl.maximum(mid, full_end)),
            mid if part == 0 else (full_end if part == 1 else n_q),
            n_q,
            qk_scale,
            sm_scale,
            HEAD_DIM,
            D_PAD,
            BLOCK_Q,
            part != 1,
            IS_CAUSAL,
            PRECISION,
            USE_DESC,
            FUSE_DQ,
        )

    dk = dk * sm_scale
    store_tile(
        dk_dst,
        k0,
        dk.to(DK.dtype.element_ty),
        offs_k,
        n_k,
        stride_dkn,
        stride_dkd,
        offs_d,
        HEAD_DIM,
        D_PAD,
        USE_DESC,
    )
    store_tile(
        dv_dst,
        k0,
        dv.to(DV.dtype.element_ty),
        offs_k,
        n_k,
        stride_dvn,
        stride_dvd,
        offs_d,
        HEAD_DIM,
        D_PAD,
        USE_DESC,
    )


@triton.jit
def _dq_inner(
    dq,
    q,
    do,
    lse,
    delta,
    k_src,
    v_src,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    offs_q,
    offs_d,
    start,
    stop,
    n_k,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_DESC: tl.constexpr,
):
    """dQ += dS K over key tiles [start, stop); lse in log2 units."""
    offs_kb = tl.arange(0, BLOCK_K)
    for start_k in range(start, stop, BLOCK_K):
        offs_k = start_k + offs_kb
        k = load_tile(
            k_src,
            start_k,
            offs_k,
            n_k,
            stride_kn,
            stride_kd,
            offs_d,
            HEAD_DIM,
            D_PAD,
            MASKED,
            USE_DESC,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        p = tl.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            valid = offs_k[None, :] < n_k
            if IS_CAUSAL:
                valid = valid & (offs_q[:, None] >= offs_k[None, :])
            p = tl.where(valid, p, 0.0)
        v = load_tile(
            v_src,
            start_k,
            offs_k,
            n_k,
            stride_vn,
            stride_vd,
            offs_d,
            HEAD_DIM,
            D_PAD,
            MASKED,
            USE_DESC,
        )
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DQ,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_dob,
    stride_doh,
    stride_don,
    stride_dod,
    stride_dqb,
    stride_dqh,
    stride_dqn,
    stride_dqd,
    n_heads,
    n_q,
    n_k,
    qk_scale,
    sm_scale,
    N_Q_BUCKET,
    N_K_BUCKET,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_DESC: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """dQ = scale * dS K for one query tile, over the key tiles it can see; grid
    (batch x heads, query tiles), heaviest tiles first under causal masking."""
    pid_bh = tl.program_id(0)
    pid_q = tile_index(1, IS_CAUSAL)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    q_src = tile_source(
        Q + off_b * stride_qb + off_h * stride_qh, n_q, stride_qn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    do_src = tile_source(
        DO + off_b * stride_dob + off_h * stride_doh, n_q, stride_don, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    k_src = tile_source(
        K + off_b * stride_kb + off_h * stride_kh, n_k, stride_kn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    v_src = tile_source(
        V + off_b * stride_vb + off_h * stride_vh, n_k, stride_vn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dq_dst = tile_source(
        DQ + off_b * stride_dqb + off_h * stride_dqh, n_q, stride_dqn, BLOCK_Q, HEAD_DIM, USE_DESC
    )

    q0 = pid_q * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D_PAD)
    q = load_tile(
        q_src, q0, offs_q, n_q, stride_qn, stride_qd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    do = load_tile(
        do_src, q0, offs_q, n_q, stride_don, stride_dod, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    in_q = offs_q < n_q
    lse = tl.load(L + pid_bh.to(tl.int64) * n_q + offs_q, mask=in_q, other=0.0) * 1.4426950408889634
    delta = tl.load(Delta + pid_bh.to(tl.int64) * n_q + offs_q, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_Q, D_PAD], dtype=tl.float32)

    lo_masked, hi = key_range(q0, n_k, BLOCK_Q, BLOCK_K, IS_CAUSAL)
    for masked in tl.static_range(2):
        dq = _dq_inner(
            dq,
            q,
            do,
            lse,
            delta,
            k_src,
            v_src,
            stride_kn,
            stride_kd,
            stride_vn,
            stride_vd,
            offs_q,
            offs_d,
            lo_masked if masked else 0,
            hi if masked else lo_masked,
            n_k,
            qk_scale,
            HEAD_DIM,
            D_PAD,
            BLOCK_K,
            masked == 1,
            IS_CAUSAL,
            PRECISION,
            USE_DESC,
        )

    dq = dq * sm_scale
    store_tile(
        dq_dst,
        q0,
        dq.to(DQ.dtype.element_ty),
        offs_q,
        n_q,
        stride_dqn,
        stride_dqd,
        offs_d,
        HEAD_DIM,
        D_PAD,
        USE_DESC,
    )
