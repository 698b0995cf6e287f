"""Attention functions by name, for the model's pluggable attention (`fn(q, k, v, is_causal)` on
(batch, heads, seq, d_head) tensors): the model's own `naive` and `sdpa`, our kernels, and
`sdpa_cudnn`, PyTorch's SDPA held to its cuDNN backend (a peer our kernels are measured
against, and what the engine runs where it measures faster than ours)."""

from __future__ import annotations

import torch

from cs336_systems.model import ATTENTION_FUNCTIONS, AttentionFn

KERNEL_ATTENTIONS = ("flash_triton", "sdpa_cudnn")


def cudnn_attention(q, k, v, is_causal: bool = True) -> torch.Tensor:
    """SDPA's cuDNN backend called as its ATen op (differentiable, traced by torch.compile as
    one op); CUDA only."""
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, is_causal)[
        0
    ]


def attention_function(name: str) -> AttentionFn:
    """The attention called `name`; importing a kernel only when it is asked for."""
    if name == "flash_triton":
        from cs336_systems.kernels.flash_triton import flash_attention

        return flash_attention
    if name == "sdpa_cudnn":
        return cudnn_attention
    if name not in ATTENTION_FUNCTIONS:
        known = sorted({*ATTENTION_FUNCTIONS, *KERNEL_ATTENTIONS})
        raise ValueError(f"unknown attention {name!r}; known: {known}")
    return ATTENTION_FUNCTIONS[name]
