"""The Triton-language forward kernel (`_attn_fwd`): one program per (query tile, batch x head),
launched on a (batch x heads, query tiles) grid, heaviest tiles first under causal masking. Each
program keeps its Q tile on chip and walks over K/V tiles with the online softmax in fp32
accumulators (base-2 exponentials with the scale folded in); P is cast to V's dtype before the
PV product, O is cast back to the input dtype, and the logsumexp L (natural log, fp32) is saved
for the backward. Key tiles entirely above the diagonal are never visited; only the tiles that
cross it (and the ragged last tile) pay for the mask."""

from __future__ import annotations

import triton
import triton.language as tl

from cs336_systems.kernels.triton.common import (
    NOT_SPECIALIZED,
    key_range,
    load_tile,
    store_tile,
    tile_index,
    tile_source,
)


@triton.jit
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
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
    """Online-softmax update over key tiles [start, stop); MASKED tiles check bounds/causality.
    Scores stay unscaled until the exponent, where scale and max fold into one multiply-add."""
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
        if MASKED:
            valid = offs_k[None, :] < n_k
            if IS_CAUSAL:
                valid = valid & (offs_q[:, None] >= offs_k[None, :])
            s = tl.where(valid, s, float("-inf"))
        # every row has seen key 0 by now (top-left causal), so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
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
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _attn_fwd(
    Q,
    K,
    V,
    O,
    L,
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
    stride_ob,
    stride_oh,
    stride_on,
    stride_od,
    n_heads,
    n_q,
    n_k,
    qk_scale,
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
    # grid (batch x heads, query tiles)
    pid_bh = tl.program_id(0)
    pid_q = tile_index(1, IS_CAUSAL)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    q_src = tile_source(
        Q + off_b * stride_qb + off_h * stride_qh, n_q, stride_qn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    k_src = tile_source(
        K + off_b * stride_kb + off_h * stride_kh, n_k, stride_kn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    v_src = tile_source(
        V + off_b * stride_vb + off_h * stride_vh, n_k, stride_vn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    o_dst = tile_source(
        O + off_b * stride_ob + off_h * stride_oh, n_q, stride_on, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    l_base = L + pid_bh.to(tl.int64) * n_q

    q0 = pid_q * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D_PAD)
    q = load_tile(
        q_src, q0, offs_q, n_q, stride_qn, stride_qd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )

    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, D_PAD], dtype=tl.float32)

    lo_masked, hi = key_range(q0, n_k, BLOCK_Q, BLOCK_K, IS_CAUSAL)
    for masked in tl.static_range(2):
        acc, l_i, m_i = _fwd_inner(
            acc,
            l_i,
            m_i,
            q,
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

    o = acc / l_i[:, None]
    store_tile(
        o_dst,
        q0,
        o.to(O.dtype.element_ty),
        offs_q,
        n_q,
        stride_on,
        stride_od,
        offs_d,
        HEAD_DIM,
        D_PAD,
        USE_DESC,
    )
    # L in natural-log units: (m + log2 l) / log2(e)
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(l_base + offs_q, lse, mask=offs_q < n_q)
