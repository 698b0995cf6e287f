"""FlashAttention-2 in Triton: forward and backward kernels and their autograd Function.

Forward: one program per (query tile, batch x head), launched on a (cdiv(n_q, BLOCK_Q), B*H)
grid. Each program keeps its Q tile on chip and walks over K/V tiles with the online softmax,
in fp32 accumulators (base-2 exponentials with the scale folded in); P is cast to V's dtype
before the PV product, O is cast back to the input dtype, and the logsumexp L (natural log,
fp32) is saved for backward.

Backward: D = rowsum(O * dO) in a small kernel, then a key-tile pass (dK, dV: each program owns
a K/V tile and walks over query tiles) and a query-tile pass (dQ: each program owns a Q tile and
walks over key tiles), both recomputing P = exp(S - L). No atomics, no (n x n) buffer.

Causal masking is a compile-time flag, top-left aligned (``query index >= key index``, the
convention of the course's reference and of torch SDPA's ``is_causal``).
Key tiles entirely above the diagonal are never visited; only the tiles that cross it (and the
ragged last tile) pay for the mask.

Any lengths work (masked loads), n_queries may differ from n_keys, d is padded to a power of two
(>= 16) with masks, so 1 <= d <= 128; inputs are addressed through their strides, so transposed
or sliced (batch, heads, n, d) views need no copy. fp16, bf16 and fp32 inputs; fp32 matmuls use
TF32 tensor cores only when torch allows it (``torch.get_float32_matmul_precision() != "highest"``).

Tile sizes are autotuned per (head dim, dtype, causal, power-of-two bucket of n) on the GPU;
``chosen_configs()`` reports the last choice. Without CUDA, importing this module turns on
Triton's interpreter (unless TRITON_INTERPRET is set) so the same kernels run on CPU tensors.
"""

from __future__ import annotations

import functools
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # the jit decorator below picks interpreter or compiler at definition time
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from cs336_systems.kernels.flash_pytorch import check_attention_inputs  # noqa: E402
from cs336_systems.kernels.hopper import configs as hopper_configs  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
MAX_HEAD_DIM = 128
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634
# runtime sizes are not specialised on (divisible by 16, == 1): fewer compiled variants
NOT_SPECIALIZED = ["n_heads", "n_q", "n_k", "N_Q_BUCKET", "N_K_BUCKET"]
# Interpreter mode runs each program in numpy: small tiles keep the tests' tile logic busy.
INTERPRET_BLOCKS = {
    "forward": (16, 16),
    "backward_dkdv": (16, 16),
    "backward_dq": (16, 16),
    "backward_fused": (16, 16),
}


def _fix_interpreter_scalar_index() -> None:
    """Triton's interpreter holds scalars as 1-element arrays and turns them into loop bounds with
    ``int(array)``, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted"), so
    any ``range(0, n)`` over a runtime bound fails. Convert through ``.item()`` instead."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_scalar_index_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._scalar_index_fixed = True
    interpreter._patch_lang_tensor = patched


def _add_interpreter_descriptor_reduce() -> None:
    """Triton 3.6's interpreter has no bulk tensor reduction (``desc.atomic_add``): emulate the
    add as load + add + store over the descriptor's in-range elements (the interpreter runs
    programs one after another, so this is atomic)."""
    try:
        from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    except ImportError:  # pragma: no cover
        return
    if hasattr(InterpreterBuilder, "create_descriptor_reduce"):
        return

    def create_descriptor_reduce(self, kind, desc, value, indices):
        if "ADD" not in str(kind).upper():
            raise NotImplementedError(f"descriptor reduction {kind} in the interpreter")
        ptrs, mask = desc.materialize_pointers(indices)
        zero = TensorHandle(np.zeros_like(value.data), value.dtype.scalar)
        old = self.create_masked_load(ptrs, mask, zero, None, None, False)
        total = TensorHandle(old.data + value.data, value.dtype.scalar)
        return self.create_masked_store(ptrs, total, mask, None, None)

    InterpreterBuilder.create_descriptor_reduce = create_descriptor_reduce


if INTERPRET:
    import numpy as np

    _fix_interpreter_scalar_index()
    _add_interpreter_descriptor_reduce()


# ----------------------------------------------------------------------------- helpers


@triton.jit
def _load_rows(
    ptrs,
    rows,
    n_rows,
    offs_d,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
):
    """Load a (rows x D_PAD) tile; rows >= n_rows and padded features read as zero."""
    if CHECK_ROWS:
        mask = rows[:, None] < n_rows
        if D_PAD != HEAD_DIM:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        if D_PAD != HEAD_DIM:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _source(
    base, n_rows, stride_n, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_DESC: tl.constexpr
):
    """What tiles of one (n_rows x HEAD_DIM) head are read from (and written to): a tensor
    descriptor (Hopper's bulk tensor copies; out-of-range rows read as zero, stores clipped) or
    the base pointer itself."""
    if USE_DESC:
        src = tl.make_tensor_descriptor(
            base, shape=[n_rows, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK, HEAD_DIM]
        )
    else:
        src = base
    return src


@triton.jit
def _load_tile(
    src,
    row0,
    rows,
    n_rows,
    stride_n,
    stride_d,
    offs_d,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
    USE_DESC: tl.constexpr,
):
    """The tile of rows `rows` (= row0 + arange) from a `_source`."""
    if USE_DESC:
        x = src.load([row0, 0])
    else:
        x = _load_rows(
            src + rows[:, None] * stride_n + offs_d[None, :] * stride_d,
            rows,
            n_rows,
            offs_d,
            HEAD_DIM,
            D_PAD,
            CHECK_ROWS,
        )
    return x


@triton.jit
def _store_tile(
    dst,
    row0,
    x,
    rows,
    n_rows,
    stride_n,
    stride_d,
    offs_d,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    USE_DESC: tl.constexpr,
):
    if USE_DESC:
        dst.store([row0, 0], x)
    else:
        mask = rows[:, None] < n_rows
        if D_PAD != HEAD_DIM:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        tl.store(dst + rows[:, None] * stride_n + offs_d[None, :] * stride_d, x, mask=mask)


@triton.jit
def _tile_index(TILE_AXIS: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """This program's tile along the grid's tile axis. With causal masking the work per tile
    grows with the query index: heaviest tiles are launched first (longest-processing-time
    order), so the last wave is made of the short ones."""
    if HEAVY_LAST:
        return tl.num_programs(TILE_AXIS) - 1 - tl.program_id(TILE_AXIS)
    return tl.program_id(TILE_AXIS)


@triton.jit
def _key_range(q0, n_k, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Key tiles of the query tile starting at q0: [0, lo_masked) need no masks (causal: keys
    before q0, visible to every row), [lo_masked, hi) do (the diagonal, the ragged end); keys
    from hi on are visible to no row of the tile."""
    if IS_CAUSAL:
        hi = tl.minimum(n_k, q0 + BLOCK_Q)
        lo_masked = (tl.minimum(q0, n_k) // BLOCK_K) * BLOCK_K
    else:
        hi = n_k
        lo_masked = (n_k // BLOCK_K) * BLOCK_K
    return lo_masked, hi


# ----------------------------------------------------------------------------- forward


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
        k = _load_tile(
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
        v = _load_tile(
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
    pid_q = _tile_index(1, IS_CAUSAL)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    q_src = _source(
        Q + off_b * stride_qb + off_h * stride_qh, n_q, stride_qn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    k_src = _source(
        K + off_b * stride_kb + off_h * stride_kh, n_k, stride_kn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    v_src = _source(
        V + off_b * stride_vb + off_h * stride_vh, n_k, stride_vn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    o_dst = _source(
        O + off_b * stride_ob + off_h * stride_oh, n_q, stride_on, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    l_base = L + pid_bh.to(tl.int64) * n_q

    q0 = pid_q * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D_PAD)
    q = _load_tile(
        q_src, q0, offs_q, n_q, stride_qn, stride_qd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )

    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, D_PAD], dtype=tl.float32)

    lo_masked, hi = _key_range(q0, n_k, BLOCK_Q, BLOCK_K, IS_CAUSAL)
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
    _store_tile(
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


# ----------------------------------------------------------------------------- backward


@triton.jit(do_not_specialize=["n_heads", "n_q"])
def _attn_bwd_preprocess(
    O,
    DO,
    Delta,
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
):
    """D = rowsum(O * dO) in fp32, one row per query; grid (batch x heads, query tiles)."""
    pid_bh = tl.program_id(0)
    pid_q = tl.program_id(1)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D_PAD)
    o_base = O + off_b * stride_ob + off_h * stride_oh
    do_base = DO + off_b * stride_dob + off_h * stride_doh
    o = _load_rows(
        o_base + offs_q[:, None] * stride_on + offs_d[None, :] * stride_od,
        offs_q,
        n_q,
        offs_d,
        HEAD_DIM,
        D_PAD,
        True,
    )
    do = _load_rows(
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
        q = _load_tile(
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
        do = _load_tile(
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
    q_src = _source(
        Q + off_b * stride_qb + off_h * stride_qh, n_q, stride_qn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    do_src = _source(
        DO + off_b * stride_dob + off_h * stride_doh, n_q, stride_don, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    k_src = _source(
        K + off_b * stride_kb + off_h * stride_kh, n_k, stride_kn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    v_src = _source(
        V + off_b * stride_vb + off_h * stride_vh, n_k, stride_vn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dk_dst = _source(
        DK + off_b * stride_dkb + off_h * stride_dkh, n_k, stride_dkn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dv_dst = _source(
        DV + off_b * stride_dvb + off_h * stride_dvh, n_k, stride_dvn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dq_dst = _source(
        DQ + off_b * stride_dqb + off_h * stride_dqh, n_q, stride_dqn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    l_base = L + pid_bh.to(tl.int64) * n_q
    delta_base = Delta + pid_bh.to(tl.int64) * n_q

    k0 = pid_k * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, D_PAD)
    k = _load_tile(
        k_src, k0, offs_k, n_k, stride_kn, stride_kd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    v = _load_tile(
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
    _store_tile(
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
    _store_tile(
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
        k = _load_tile(
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
        v = _load_tile(
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
    pid_q = _tile_index(1, IS_CAUSAL)
    off_b = (pid_bh // n_heads).to(tl.int64)
    off_h = (pid_bh % n_heads).to(tl.int64)
    q_src = _source(
        Q + off_b * stride_qb + off_h * stride_qh, n_q, stride_qn, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    do_src = _source(
        DO + off_b * stride_dob + off_h * stride_doh, n_q, stride_don, BLOCK_Q, HEAD_DIM, USE_DESC
    )
    k_src = _source(
        K + off_b * stride_kb + off_h * stride_kh, n_k, stride_kn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    v_src = _source(
        V + off_b * stride_vb + off_h * stride_vh, n_k, stride_vn, BLOCK_K, HEAD_DIM, USE_DESC
    )
    dq_dst = _source(
        DQ + off_b * stride_dqb + off_h * stride_dqh, n_q, stride_dqn, BLOCK_Q, HEAD_DIM, USE_DESC
    )

    q0 = pid_q * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, D_PAD)
    q = _load_tile(
        q_src, q0, offs_q, n_q, stride_qn, stride_qd, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    do = _load_tile(
        do_src, q0, offs_q, n_q, stride_don, stride_dod, offs_d, HEAD_DIM, D_PAD, True, USE_DESC
    )
    in_q = offs_q < n_q
    lse = tl.load(L + pid_bh.to(tl.int64) * n_q + offs_q, mask=in_q, other=0.0) * 1.4426950408889634
    delta = tl.load(Delta + pid_bh.to(tl.int64) * n_q + offs_q, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_Q, D_PAD], dtype=tl.float32)

    lo_masked, hi = _key_range(q0, n_k, BLOCK_Q, BLOCK_K, IS_CAUSAL)
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
    _store_tile(
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


# ----------------------------------------------------------------------------- autotuning


# (BLOCK_Q, BLOCK_K, num_warps, num_stages) per kernel, operand width and head dim ("16bit" for
# d <= 64, "16bit-d128" above). Few on purpose: every (head dim, dtype, causal) combination
# compiles each of them; scripts/flash_tune.py measures the wider grid they were picked from.
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


def _triton_configs(kernel: str) -> list[triton.Config]:
    tiles = dict.fromkeys(t for group in TILE_CONFIGS[kernel].values() for t in group)
    return [
        triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=st)
        for bq, bk, w, st in tiles
    ]


def _pruner(kernel: str):
    def prune(configs, named_args, **kwargs):
        """Keep the tiles meant for this operand width and head dim, not far larger than the
        problem."""
        args = {**named_args, **kwargs}
        allowed = set(tile_configs(kernel, args["Q"].dtype, args["HEAD_DIM"]))
        n_q, n_k = args["N_Q_BUCKET"], args["N_K_BUCKET"]
        kept = [
            c
            for c in configs
            if (c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages) in allowed
        ]
        small = [
            c
            for c in kept
            if c.kwargs["BLOCK_Q"] <= max(n_q, 64) and c.kwargs["BLOCK_K"] <= max(n_k, 64)
        ]
        return small or kept[-1:]

    return prune


def _bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _autotuned(kernel_fn, kernel: str):
    options = dict(
        configs=_triton_configs(kernel),
        key=TUNE_KEY,
        prune_configs_by={"early_config_prune": _pruner(kernel)},
    )
    try:  # short benchmarks and an on-disk cache of the choice, where this Triton has them
        return triton.autotune(**options, do_bench=_bench, cache_results=True)(kernel_fn)
    except TypeError:
        return triton.autotune(**options)(kernel_fn)


_RAW = {
    "forward": _attn_fwd,
    "backward_dkdv": _attn_bwd_dkdv,
    "backward_dq": _attn_bwd_dq,
    "backward_fused": _attn_bwd_dkdv,
}
_TUNED = {} if INTERPRET else {name: _autotuned(fn, name) for name, fn in _RAW.items()}
_CHOSEN: dict[str, dict] = {}


def chosen_configs() -> dict[str, dict]:
    """The tile configuration of each kernel that the last forward and the last backward call
    launched (autotuned on the GPU)."""
    return {name: dict(cfg) for name, cfg in _CHOSEN.items()}


def _launch(kernel: str, args: tuple, meta: dict, n_tiles_of, bh: int, config) -> None:
    """Launch `kernel` on a (batch x heads, tiles) grid: autotuned, or with `config` (a
    (BLOCK_Q, BLOCK_K) pair, or a dict with BLOCK_Q, BLOCK_K and optionally num_warps and
    num_stages), or the interpreter's small tiles. `n_tiles_of(BLOCK_Q, BLOCK_K)` sizes the grid."""
    tuned = _TUNED.get(kernel)
    if config is None and tuned is not None:
        tuned[lambda c: (bh, n_tiles_of(c["BLOCK_Q"], c["BLOCK_K"]))](*args, **meta)
        best = tuned.best_config
        _CHOSEN[kernel] = {
            **best.kwargs,
            "num_warps": best.num_warps,
            "num_stages": best.num_stages,
            "use_desc": meta["USE_DESC"],
            "autotuned": True,
        }
        return
    if config is None:
        config = INTERPRET_BLOCKS[kernel]
    if not isinstance(config, dict):
        config = dict(zip(("BLOCK_Q", "BLOCK_K"), config, strict=True))
    bq, bk = _check_blocks((config["BLOCK_Q"], config["BLOCK_K"]))
    launch = {k: config[k] for k in ("num_warps", "num_stages") if config.get(k)}
    # other keys are the kernel's own compile-time switches
    extra = {k: v for k, v in config.items() if k not in ("BLOCK_Q", "BLOCK_K", *launch)}
    grid = (bh, n_tiles_of(bq, bk))
    _RAW[kernel][grid](*args, **meta, **extra, BLOCK_Q=bq, BLOCK_K=bk, **launch)
    _CHOSEN[kernel] = {
        "BLOCK_Q": bq,
        "BLOCK_K": bk,
        "num_warps": launch.get("num_warps"),
        "num_stages": launch.get("num_stages"),
        "use_desc": meta["USE_DESC"],
        "autotuned": False,
    }


# ----------------------------------------------------------------------------- tensor descriptors


def _alloc(size: int, alignment: int, stream) -> torch.Tensor:
    """Scratch for device-side tensor descriptors (128 bytes per program)."""
    device = "cpu" if INTERPRET else "cuda"
    return torch.empty(size, dtype=torch.int8, device=device)


@functools.cache
def descriptors_supported() -> bool:
    """Device-side tensor descriptors (TMA): Hopper or newer, or the interpreter; off with
    CS336_FLASH_DESC=0 (read once per process)."""
    if os.environ.get("CS336_FLASH_DESC", "1") == "0" or not hasattr(tl, "make_tensor_descriptor"):
        return False
    if INTERPRET:
        return True
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def _desc_ok(tensors, d: int, d_pad: int) -> bool:
    """Every tensor addressable by a 2-D (rows x d) descriptor: unit feature stride, 16-byte
    aligned base and row stride, d a power of two (no padded features)."""
    if d != d_pad:
        return False
    for x in tensors:
        row = x.stride(-2) * x.element_size()
        if x.stride(-1) != 1 or row <= 0 or row % 16 or x.data_ptr() % 16:
            return False
        if x.dim() == 4 and any(s * x.element_size() % 16 for s in x.stride()[:2]):
            return False
    return True


def _use_desc(tensors, d: int, d_pad: int, use_desc: bool | None) -> bool:
    if use_desc is None:
        use_desc = (
            tensors[0].dtype != torch.float32
            and descriptors_supported()
            and _desc_ok(tensors, d, d_pad)
        )
    elif use_desc and not _desc_ok(tensors, d, d_pad):
        raise ValueError(
            "tensor descriptors need unit feature strides, 16-byte aligned rows and d a power of two"
        )
    if use_desc:
        triton.set_allocator(_alloc)  # a context variable: set in the thread that launches
    return bool(use_desc)


# ----------------------------------------------------------------------------- precompiling

_KERNEL_TENSORS = {
    # kernel -> (tensor args as "in"put dtype or fp32, number of 4-stride groups)
    "forward": (("in", "in", "in", "in", "f32"), 4),
    "backward_dkdv": (("in", "in", "in", "in", "f32", "f32", "in", "in", "in"), 7),
    "backward_fused": (("in", "in", "in", "in", "f32", "f32", "in", "in", "f32"), 7),
    "backward_dq": (("in", "in", "in", "in", "f32", "f32", "in"), 5),
    "preprocess": (("in", "in", "f32"), 2),
}


def _warmup_job(job: tuple) -> str:
    """Compile one kernel variant into Triton's on-disk cache (runs in a worker process)."""
    kernel, dtype_name, d, causal, precision, tiles, use_desc = job
    try:
        dtype = getattr(torch, dtype_name)
        fn = {**_RAW, "preprocess": _attn_bwd_preprocess}[kernel]
        kinds, n_stride_groups = _KERNEL_TENSORS[kernel]
        tensors = [dtype if kind == "in" else torch.float32 for kind in kinds]
        n = 128  # contiguous (1, 1, n, d): the same divisibility classes as real launches
        strides = (n * d, n * d, d, 1) * n_stride_groups
        d_pad = max(16, triton.next_power_of_2(d))
        meta = dict(HEAD_DIM=d, D_PAD=d_pad)
        if kernel == "preprocess":
            sizes = (1, n)
            meta["BLOCK_Q"] = 64
        else:
            scales = (0.125,) if kernel == "forward" else (0.125, 0.125)
            sizes = (1, n, n, *scales, n, n)
            bq, bk, warps, stages = tiles
            meta.update(IS_CAUSAL=causal, PRECISION=precision, USE_DESC=use_desc)
            if kernel.startswith("backward_") and kernel != "backward_dq":
                meta["FUSE_DQ"] = kernel == "backward_fused"
            meta.update(BLOCK_Q=bq, BLOCK_K=bk, num_warps=warps, num_stages=stages, num_ctas=1)
        fn.warmup(*tensors, *strides, *sizes, grid=(1,), **meta)
        return ""
    except Exception as exc:  # the autotuner compiles what is missing anyway
        return f"{kernel} {dtype_name} d={d} {tiles}: {type(exc).__name__}: {exc}"[:300]


def precompile(
    dtypes=(torch.bfloat16,),
    head_dims=(64,),
    causal=(True,),
    workers: int | None = None,
    tiles: dict | None = None,
) -> dict:
    """Compile every kernel variant the autotuner will try for these settings (or, with
    `tiles={kernel: [(BLOCK_Q, BLOCK_K, warps, stages), ...]}`, those tiles), in parallel worker
    processes, into Triton's on-disk cache; the autotuner then only loads and times them.

    Compiling is CPU-bound and single-threaded per kernel; a stage that sweeps head dims and
    dtypes would otherwise spend minutes compiling one kernel after another.
    """
    import concurrent.futures
    import multiprocessing
    import time

    if INTERPRET or not torch.cuda.is_available():
        return {"jobs": 0, "seconds": 0.0, "errors": []}
    jobs = []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        for d in head_dims:
            d_pad = max(16, triton.next_power_of_2(d))
            # what contiguous inputs of this dtype and head dim run with
            use_desc = dtype != torch.float32 and descriptors_supported() and d == d_pad
            jobs.append(("preprocess", name, d, False, "", None, False))
            for is_causal in causal:
                for kernel in (tiles or {}).keys() or KERNELS[:3]:
                    for tile in (tiles or {}).get(kernel) or tile_configs(kernel, dtype, d):
                        prec = _precision(dtype)
                        jobs.append((kernel, name, d, bool(is_causal), prec, tile, use_desc))
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1, 16))
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        errors = [e for e in pool.map(_warmup_job, jobs) if e]
    return {"jobs": len(jobs), "seconds": time.perf_counter() - t0, "errors": errors}


# ----------------------------------------------------------------------------- launchers


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 4 else x.unsqueeze(1)


def _strides(x: torch.Tensor) -> tuple[int, int, int, int]:
    return tuple(x.stride())  # type: ignore[return-value]


def _pow2_bucket(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 16))


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"  # ignored for fp16/bf16 operands


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError naming the shapes for anything the kernels cannot run correctly."""
    check_attention_inputs(q, k, v, dtypes=DTYPES, max_head_dim=MAX_HEAD_DIM)
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set before importing "
            f"this module); got tensors on {q.device} with q {tuple(q.shape)}"
        )
    if INTERPRET and q.device.type != "cpu":
        raise ValueError(f"Triton's interpreter runs on CPU tensors; got {q.device}")


def _launch_common(q4, k4, v4):
    b, h, n_q, d = q4.shape
    n_k = k4.shape[-2]
    d_pad = max(16, triton.next_power_of_2(d))
    return b, h, n_q, n_k, d, d_pad


@functools.cache
def _hopper_module():
    """`flash_attention_hopper` (Gluon kernels for Hopper), or None where it cannot be used: in the
    interpreter, with CS336_FLASH_GLUON=0, or on a Triton whose Gluon API differs (Gluon is
    experimental and changes between releases)."""
    if INTERPRET or os.environ.get("CS336_FLASH_GLUON", "1") == "0":
        return None
    try:
        from cs336_systems.kernels.hopper import launch as flash_attention_hopper
    except Exception:  # ImportError, or an API that moved
        return None
    return flash_attention_hopper


def flash_forward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    blocks=None,
    use_desc: bool | None = None,
    use_gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel on (batch, n, d) or (batch, heads, n, d); returns (O, L fp32).

    On Hopper, 16-bit inputs go to the Gluon kernel of `flash_attention_hopper` (FlashAttention-3's
    overlap of softmax and matrix products) at the head dims where it measured faster
    (`flash_attention_hopper.routed`; any of 16/32/64/128 with `use_gluon=True`), unless
    `use_gluon=False`, `blocks` or `use_desc=False` is given; everything else runs this module's
    Triton kernel. `blocks` bypasses autotuning: (BLOCK_Q, BLOCK_K) (tests use it to exercise
    tile edges) or a dict that may add num_warps and num_stages. `use_desc` forces tensor
    descriptors on or off (default: on for 16-bit inputs they fit, on Hopper or newer).
    """
    check_inputs(q, k, v)
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    b, h, n_q, n_k, d, d_pad = _launch_common(q4, k4, v4)
    hopper = _hopper_module() if use_gluon is not False else None
    if hopper is not None and blocks is None and use_desc is not False:
        if (use_gluon or hopper_configs.routed("forward", d)) and hopper.supported(q4, k4, v4):
            o, lse = hopper.forward(q4, k4, v4, bool(is_causal))
            _CHOSEN["forward"] = hopper_configs.chosen_config("forward", d)
            return (o.squeeze(1), lse.squeeze(1)) if q.dim() == 3 else (o, lse)
    if use_gluon:
        raise ValueError(
            f"the Gluon kernels need a Hopper GPU, fp16/bf16, head dim in 16/32/64/128 and "
            f"16-byte aligned strides; got q {tuple(q.shape)} {q.dtype} on {q.device}"
        )
    o = torch.empty((b, h, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    sm_scale = d**-0.5
    desc = _use_desc((q4, k4, v4, o), d, d_pad, use_desc)
    args = (
        q4,
        k4,
        v4,
        o,
        lse,
        *_strides(q4),
        *_strides(k4),
        *_strides(v4),
        *_strides(o),
        h,
        n_q,
        n_k,
        sm_scale * LOG2E,
        _pow2_bucket(n_q),
        _pow2_bucket(n_k),
    )
    meta = dict(
        HEAD_DIM=d,
        D_PAD=d_pad,
        IS_CAUSAL=bool(is_causal),
        PRECISION=_precision(q.dtype),
        USE_DESC=desc,
    )
    _launch("forward", args, meta, lambda bq, bk: triton.cdiv(n_q, bq), b * h, blocks)
    if q.dim() == 3:
        return o.squeeze(1), lse.squeeze(1)
    return o, lse


def flash_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool = False,
    blocks=None,
    use_desc: bool | None = None,
    fuse_dq: bool = False,
    use_gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernels: D = rowsum(O*dO), then a dK/dV pass and a separate dQ pass (the
    default: seven matmuls per tile pair, no atomics, deterministic) or, with `fuse_dq=True`, one
    pass that computes dK and dV and adds each tile's dQ into an fp32 accumulator (five
    matmuls; bulk tensor reductions with descriptors, atomics without). On an H100 the fused
    pass measured slower (docs/flash-attention-notes.md).

    `blocks`: as in flash_forward_triton, for every pass, or a dict with one entry per pass
    ("backward_dkdv" and "backward_dq", or "backward_fused"). On Hopper the dK/dV and dQ passes
    are the Gluon kernels of `flash_attention_hopper` where they are routed (as for the
    forward; not with `fuse_dq`, `blocks`, `use_desc=False` or `use_gluon=False`); the Gluon dQ
    pass then runs first and computes D itself, unless the head dim's Gluon dK/dV pass computes
    dQ as well (`flash_attention_hopper.fuses_dq`, at d = 64: after the D kernel, into an fp32
    accumulator).
    """
    q4, k4, v4, o4, do4 = (_as_4d(x) for x in (q, k, v, o, do))
    b, h, n_q, n_k, d, d_pad = _launch_common(q4, k4, v4)
    for name in KERNELS[1:]:  # chosen_configs() names the passes this call runs
        _CHOSEN.pop(name, None)
    lse = lse.reshape(b, h, n_q).contiguous()
    delta = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    # gradients take their input's layout where it is dense (empty_like's preserve_format)
    dq, dk, dv = torch.empty_like(q4), torch.empty_like(k4), torch.empty_like(v4)
    do_given = do4
    broadcast = False  # dO is one row of d values repeated through zero strides
    if use_desc is not False and not _desc_ok((do4,), d, d_pad):
        # e.g. the stride-0 gradient of o.sum(). The Gluon passes' TMA descriptors read a
        # (0, 0, 0, 1)-strided view of one row as it is; the Triton-language passes get one
        # dense copy (below, once the passes are chosen)
        broadcast = all(s == 0 for s in do4.stride()[:-1])
        do4 = do4[:1, :1, :1].contiguous().expand(do4.shape) if broadcast else do4.contiguous()
    fuse = bool(fuse_dq)
    hopper = _hopper_module() if use_gluon is not False else None
    # On Hopper, where routed: Gluon passes for dK/dV and for dQ; the dQ pass then runs first
    # and computes D itself. `use_gluon=True` forces both.
    gluon_ok = (
        hopper is not None
        and not fuse
        and blocks is None
        and use_desc is not False
        and hopper.supported(q4, k4, v4, do4, dq, dk, dv)
    )
    gluon_dkdv = gluon_ok and bool(use_gluon or hopper_configs.routed("backward_dkdv", d))
    if use_gluon and not gluon_dkdv:
        raise ValueError(
            f"the Gluon dK/dV kernel needs a Hopper GPU, fp16/bf16, head dim in 16/32/64/128, "
            f"no fuse_dq or blocks; got q {tuple(q.shape)} {q.dtype} on {q.device}"
        )
    # a FUSE_DQ configuration of the Gluon dK/dV pass computes dQ as well
    dq_in_dkdv = gluon_dkdv and hopper_configs.fuses_dq(d)
    gluon_dq = (
        gluon_ok
        and not dq_in_dkdv
        and bool(use_gluon or hopper_configs.routed("backward_dq", d))
        and hopper.supported(q4, o4)
    )
    if broadcast and not (gluon_dkdv and (gluon_dq or dq_in_dkdv)):
        do4 = do_given.contiguous()
    desc = _use_desc((q4, k4, v4, do4, dq, dk, dv), d, d_pad, use_desc)
    sm_scale = d**-0.5
    strides = (*_strides(q4), *_strides(k4), *_strides(v4), *_strides(do4))
    scalars = (h, n_q, n_k, sm_scale * LOG2E, sm_scale, _pow2_bucket(n_q), _pow2_bucket(n_k))
    meta = dict(
        HEAD_DIM=d,
        D_PAD=d_pad,
        IS_CAUSAL=bool(is_causal),
        PRECISION=_precision(q.dtype),
        USE_DESC=desc,
    )
    per_pass = isinstance(blocks, dict) and any(key in blocks for key in KERNELS)

    def pick(kernel):
        return blocks.get(kernel) if per_pass else blocks

    if gluon_dq:
        hopper.backward_dq(q4, k4, v4, do4, lse, delta, dq, bool(is_causal), o=o4)
        _CHOSEN["backward_dq"] = hopper_configs.chosen_config("backward_dq", d)
    else:
        pre_block = 64 if not INTERPRET else 16
        _attn_bwd_preprocess[(b * h, triton.cdiv(n_q, pre_block))](
            o4,
            do_given,
            delta,
            *_strides(o4),
            *_strides(do_given),
            h,
            n_q,
            HEAD_DIM=d,
            D_PAD=d_pad,
            BLOCK_Q=pre_block,
        )

    # dQ target: the fp32 accumulator (fused) or the output itself (its own pass)
    dq_target = torch.zeros((b, h, n_q, d), dtype=torch.float32, device=q.device) if fuse else dq
    kernel = "backward_fused" if fuse else "backward_dkdv"
    if gluon_dkdv:
        hopper.backward_dkdv(q4, k4, v4, do4, lse, delta, dk, dv, bool(is_causal), dq=dq)
        _CHOSEN[kernel] = hopper_configs.chosen_config(kernel, d)
    else:
        dkdv_args = (q4, k4, v4, do4, lse, delta, dk, dv, dq_target, *strides)
        _launch(
            kernel,
            (*dkdv_args, *_strides(dk), *_strides(dv), *_strides(dq_target), *scalars),
            {**meta, "FUSE_DQ": fuse},
            lambda bq, bk: triton.cdiv(n_k, bk),
            b * h,
            pick(kernel),
        )
    if fuse:
        dq.copy_(dq_target)
    elif not (gluon_dq or dq_in_dkdv):
        dq_args = (q4, k4, v4, do4, lse, delta, dq, *strides, *_strides(dq), *scalars)
        _launch(
            "backward_dq",
            dq_args,
            meta,
            lambda bq, bk: triton.cdiv(n_q, bq),
            b * h,
            pick("backward_dq"),
        )
    if q.dim() == 3:
        return dq.squeeze(1), dk.squeeze(1), dv.squeeze(1)
    return dq, dk, dv


def _check_blocks(blocks: tuple[int, int]) -> tuple[int, int]:
    bq, bk = (int(x) for x in blocks)
    for x in (bq, bk):
        if x < 16 or x & (x - 1):
            raise ValueError(f"tile sizes must be powers of two >= 16, got {blocks}")
    return bq, bk


# The launchers as PyTorch custom operators: torch.compile (e.g. of FlashAttentionTriton.apply,
# as the course's leaderboard runs it) sees two opaque ops with known output shapes instead of
# tracing into the launchers and recompiling the kernels itself.
@torch.library.custom_op("cs336_systems::flash_triton_forward", mutates_args=())
def _forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_forward_triton(q, k, v, is_causal)


@_forward_op.register_fake
def _forward_fake(q, k, v, is_causal):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cs336_systems::flash_triton_backward", mutates_args=())
def _backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_backward_triton(q, k, v, o, do, lse, is_causal)


@_backward_op.register_fake
def _backward_fake(q, k, v, o, do, lse, is_causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels: ``FlashAttentionTriton.apply(Q, K, V, is_causal=False)``
    on (batch, n, d) or (batch, heads, n, d). Saves Q, K, V, O and L (fp32, Q's shape less d)."""

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        # the custom op under torch.compile; eager calls skip its dispatch (~80 us per call
        # measured on an H100, as much as the launch itself)
        if torch.compiler.is_compiling():
            O, L = _forward_op(Q, K, V, bool(is_causal))
        else:
            O, L = flash_forward_triton(Q, K, V, bool(is_causal))
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal = bool(is_causal)
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        if torch.compiler.is_compiling():
            dQ, dK, dV = _backward_op(Q, K, V, O, dO, L, ctx.is_causal)
        else:
            dQ, dK, dV = flash_backward_triton(Q, K, V, O, dO, L, ctx.is_causal)
        return dQ, dK, dV, None


@torch.compiler.disable
def flash_attention(q, k, v, is_causal: bool = True) -> torch.Tensor:
    """Multi-head entry point, (batch, heads, n, d): the model's attention-function interface.

    Opaque to torch.compile (a graph break), so a compiled model calls the kernels as they are.
    """
    if q.dim() != 4:
        raise ValueError(
            f"flash_attention expects (batch, heads, n, d) tensors; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    return FlashAttentionTriton.apply(q, k, v, is_causal)


def _register() -> None:
    from cs336_systems import model

    model.ATTENTION_FUNCTIONS["flash_triton"] = flash_attention


_register()
