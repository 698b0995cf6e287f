"""FlashAttention-2 written in PyTorch: tiled forward with the online softmax, backward by
recomputation from the saved logsumexp.

Shapes: Q is (..., n_queries, d), K and V are (..., n_keys, d), with the same leading (batch or
batch x heads) dims. The causal mask is top-left aligned, ``query index >= key index``, the
convention of the course's reference and of torch SDPA's ``is_causal`` (for n_queries != n_keys,
cs336_systems.model.naive_attention aligns bottom-right instead; the two agree when square).

Forward walks over key tiles and updates every query tile at once (the query tiles are
independent, as the programs of a GPU grid are); with ``is_causal`` a key tile only touches the
query tiles on or below the diagonal, so tiles entirely above it cost nothing. It keeps, per
query row, the running maximum m, the running denominator l and the unnormalised output, and
saves L = m + log(l) (fp32) for the backward pass, which recomputes P = exp(S - L) instead of
storing the (n_queries x n_keys) matrix.
"""

from __future__ import annotations

import math

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MIN_TILE = 16


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES,
    max_head_dim: int | None = None,
    ranks: tuple[int, ...] = (3, 4),
) -> None:
    """Raise ValueError (naming the shapes) unless q, k, v form a valid attention problem."""
    shapes = (
        f"q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}"
    )
    if not (q.dim() == k.dim() == v.dim()) or q.dim() not in ranks:
        raise ValueError(
            f"attention inputs must all have rank in {ranks} ((batch, n, d) or (batch, heads, n, d)); got {shapes}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"attention inputs disagree on batch/head dims; got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys; got {shapes}")
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        raise ValueError(f"q, k and v must share the head dimension d; got {shapes}")
    if q.shape[-2] < 1 or k.shape[-2] < 1 or q.shape[-1] < 1:
        raise ValueError(f"attention needs at least one query, one key and d >= 1; got {shapes}")
    if max_head_dim is not None and q.shape[-1] > max_head_dim:
        raise ValueError(
            f"head dimension {q.shape[-1]} exceeds the supported {max_head_dim}; got {shapes}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share one dtype; got {shapes}")
    if q.dtype not in dtypes:
        raise ValueError(f"dtype {q.dtype} not supported (supported: {list(dtypes)}); got {shapes}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device; got {q.device}, {k.device}, {v.device}"
        )


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """The (n_queries, n_keys) boolean mask of allowed pairs: query index >= key index."""
    return (
        torch.arange(n_queries, device=device)[:, None]
        >= torch.arange(n_keys, device=device)[None, :]
    )


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def flash_forward_pytorch(
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    is_causal: bool = False,
    tile_q: int = 64,
    tile_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward pass; returns (O in Q's dtype, L = logsumexp of the scaled scores, fp32)."""
    check_attention_inputs(Q, K, V, ranks=tuple(range(2, 9)))
    if tile_q < MIN_TILE or tile_k < MIN_TILE:
        raise ValueError(f"tiles must be at least {MIN_TILE}x{MIN_TILE}, got {tile_q}x{tile_k}")
    *lead, n_q, d = Q.shape
    n_k = K.shape[-2]
    acc_dtype = _accumulator_dtype(Q.dtype)
    scale = 1.0 / math.sqrt(d)
    t_q = -(-n_q // tile_q)

    # (..., query tiles, tile_q, d); padded query rows see real keys and are dropped at the end
    q_tiles = torch.nn.functional.pad(Q.to(acc_dtype), (0, 0, 0, t_q * tile_q - n_q))
    q_tiles = q_tiles.reshape(*lead, t_q, tile_q, d)
    q_rows = torch.arange(t_q * tile_q, device=Q.device).view(t_q, tile_q, 1)

    m = torch.full((*lead, t_q, tile_q), -math.inf, dtype=acc_dtype, device=Q.device)
    l_sum = torch.zeros((*lead, t_q, tile_q), dtype=acc_dtype, device=Q.device)
    acc = torch.zeros((*lead, t_q, tile_q, d), dtype=acc_dtype, device=Q.device)

    for k0 in range(0, n_k, tile_k):
        k1 = min(k0 + tile_k, n_k)
        # query tile i holds rows [i*tile_q, (i+1)*tile_q); it sees key k0 only if a row >= k0
        i0 = k0 // tile_q if is_causal else 0
        if i0 >= t_q:
            break
        k_tile = K[..., None, k0:k1, :].to(acc_dtype)
        v_tile = V[..., None, k0:k1, :].to(acc_dtype)
        s = q_tiles[..., i0:, :, :] @ k_tile.transpose(-1, -2) * scale
        if is_causal:
            allowed = q_rows[i0:] >= torch.arange(k0, k1, device=Q.device)
            s = s.masked_fill(~allowed, -math.inf)
        m_old = m[..., i0:, :]
        m_new = torch.maximum(m_old, s.amax(dim=-1))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m_old - m_new)
        l_sum[..., i0:, :] = alpha * l_sum[..., i0:, :] + p.sum(dim=-1)
        acc[..., i0:, :, :] = alpha[..., None] * acc[..., i0:, :, :] + p @ v_tile
        m[..., i0:, :] = m_new

    O = (acc / l_sum[..., None]).reshape(*lead, t_q * tile_q, d)[..., :n_q, :]
    L = (m + torch.log(l_sum)).reshape(*lead, t_q * tile_q)[..., :n_q]
    return O.to(Q.dtype).contiguous(), L.to(
        torch.promote_types(acc_dtype, torch.float32)
    ).contiguous()


def flash_backward_pytorch(
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    O: torch.Tensor,
    dO: torch.Tensor,
    L: torch.Tensor,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward by recomputation: P = exp(S - L), D = rowsum(O * dO), dS = P * (dP - D).

    Plain tensor code without data-dependent control flow, so torch.compile can compile it
    (fullgraph) and fuse the elementwise work around the five matmuls.
    """
    acc_dtype = _accumulator_dtype(Q.dtype)
    q, k, v = Q.to(acc_dtype), K.to(acc_dtype), V.to(acc_dtype)
    o, do = O.to(acc_dtype), dO.to(acc_dtype)
    scale = 1.0 / math.sqrt(Q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale
    if is_causal:
        s = s.masked_fill(~causal_mask(Q.shape[-2], K.shape[-2], Q.device), -math.inf)
    p = torch.exp(s - L.to(acc_dtype)[..., None])
    d_row = (o * do).sum(dim=-1, keepdim=True)
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - d_row)
    dq = ds @ k * scale
    dk = ds.transpose(-1, -2) @ q * scale
    return dq.to(Q.dtype), dk.to(K.dtype), dv.to(V.dtype)


_compiled_backward = None


def _backward_impl(device: torch.device):
    """torch.compile'd backward on CUDA (shapes dynamic, so lengths share one graph); eager
    elsewhere, where compiling would cost more than it saves on the small CPU problems."""
    global _compiled_backward
    if device.type != "cuda" or not FlashAttentionPytorch.compile_backward:
        return flash_backward_pytorch
    if _compiled_backward is None:
        import torch._dynamo.config as dynamo_config

        # one graph per head dim and dtype; dynamo's default limit (8) would fall back to eager
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(64, getattr(dynamo_config, name)))
        _compiled_backward = torch.compile(flash_backward_pytorch, dynamic=True)
    return _compiled_backward


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2 in PyTorch: ``FlashAttentionPytorch.apply(Q, K, V, is_causal=False)``.

    Saves Q, K, V, O and the fp32 logsumexp L (shaped like Q without its last dim); the
    backward pass recomputes the attention matrix from L.
    """

    tile_q = 64
    tile_k = 64
    compile_backward = True

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        O, L = flash_forward_pytorch(
            Q, K, V, bool(is_causal), FlashAttentionPytorch.tile_q, FlashAttentionPytorch.tile_k
        )
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal = bool(is_causal)
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        dQ, dK, dV = _backward_impl(Q.device)(Q, K, V, O, dO, L, ctx.is_causal)
        return dQ, dK, dV, None
