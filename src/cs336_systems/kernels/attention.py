"""Attention functions by name, for the model's pluggable attention (`fn(q, k, v, is_causal)` on
(batch, heads, seq, d_head) tensors): the model's own `naive` and `sdpa`, and our kernels."""

from __future__ import annotations

from cs336_systems.model import ATTENTION_FUNCTIONS, AttentionFn

KERNEL_ATTENTIONS = ("flash_triton",)


def attention_function(name: str) -> AttentionFn:
    """The attention called `name`; importing a kernel only when it is asked for."""
    if name == "flash_triton":
        from cs336_systems.kernels.flash_triton import flash_attention

        return flash_attention
    if name not in ATTENTION_FUNCTIONS:
        known = sorted({*ATTENTION_FUNCTIONS, *KERNEL_ATTENTIONS})
        raise ValueError(f"unknown attention {name!r}; known: {known}")
    return ATTENTION_FUNCTIONS[name]
