"""LM head + cross-entropy fused over chunks of tokens: the (tokens, vocab) logits never exist
in full.

``linear_cross_entropy(hidden, weight, targets)`` equals
``F.cross_entropy((hidden @ weight.T).float(), targets)`` (mean over the targets that are not
`ignore_index`). Forward walks the tokens `chunk` at a time: one chunk's logits (chunk, V) in
the compute dtype, their logsumexp and the target's logit in fp32; it keeps only the hidden
states, the weight and the per-token logsumexp (T fp32). Backward walks the chunks again,
recomputes each chunk's logits, softmax(logits) - onehot(target), scaled by the upstream
gradient over the count of targets, and accumulates grad(hidden) = g W for the chunk and
grad(W) += g^T hidden (fp32 accumulator). Peak extra memory: one chunk's logits in the compute
dtype and fp32 (~6 chunk V bytes under bf16), against 4-6 T V bytes for the unfused loss.

Cost: the head's matmul runs three times (forward, recompute, and the two gradient matmuls),
2 T d V FLOPs more than unfused (the recompute), which buys T V (4 + 2) bytes of saved logits.

Autocast: under an active autocast the matmuls run in its dtype (as ``hidden @ weight.T``
would), softmax and logsumexp in fp32 (as the unfused loss on ``.float()`` logits).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # F.cross_entropy's default; TransformerLM's targets never use it
DEFAULT_CHUNK_BYTES = 512 * 2**20  # one chunk's fp32 logits


def chunk_for(vocab_size: int, budget_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Tokens per chunk so that a chunk's fp32 logits take about `budget_bytes` (at least 1)."""
    return max(1, budget_bytes // (4 * vocab_size))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, ignore_index: int):
        t = hidden.shape[0]
        lse = torch.empty(t, dtype=torch.float32, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        valid = targets != ignore_index
        count = valid.sum()
        for s in range(0, t, chunk):
            e = min(s + chunk, t)
            logits = (hidden[s:e] @ weight.T).float()
            lse[s:e] = torch.logsumexp(logits, dim=-1)
            tgt = targets[s:e].clamp_min(0)
            picked = logits.gather(1, tgt[:, None]).squeeze(1)
            total += torch.where(valid[s:e], lse[s:e] - picked, 0.0).sum()
        ctx.save_for_backward(hidden, weight, targets, lse, count)
        ctx.chunk, ctx.ignore_index = chunk, ignore_index
        # 0/0 = nan when no target counts, as F.cross_entropy
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse, count = ctx.saved_tensors
        chunk, ignore = ctx.chunk, ctx.ignore_index
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        scale = (grad_out.float() / count).to(torch.float32)
        t = hidden.shape[0]
        for s in range(0, t, chunk):
            e = min(s + chunk, t)
            h = hidden[s:e]
            logits = (h @ weight.T).float()
            g = torch.exp(logits - lse[s:e, None])
            tgt = targets[s:e]
            valid = tgt != ignore
            g.scatter_add_(
                1, tgt.clamp_min(0)[:, None], -torch.ones_like(lse[s:e, None])
            )  # softmax - onehot
            g *= torch.where(valid, scale, 0.0)[:, None]
            g = g.to(hidden.dtype)
            if need_h:
                grad_h[s:e] = g @ weight
            if need_w:
                grad_w += g.T @ h  # fp32 accumulator
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against `targets` without the full logits.

    hidden (..., d), weight (V, d), targets (...) of class indices; `chunk` tokens per chunk
    (default: ``chunk_for(V)``)."""
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} differ")
    if hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden width {hidden.shape[-1]} != weight's {weight.shape[1]}")
    chunk = chunk or chunk_for(weight.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif hidden.dtype != weight.dtype:
        weight = weight.to(hidden.dtype)
    with torch.autocast(device_type, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), chunk, ignore_index
        )
