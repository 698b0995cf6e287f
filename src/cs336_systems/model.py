"""A pre-norm decoder-only transformer language model, readable top to bottom.

Token embedding -> num_layers x [RMSNorm -> causal multi-head self-attention with RoPE on Q and K
-> residual; RMSNorm -> SwiGLU feed-forward -> residual] -> final RMSNorm -> untied LM head.
No biases anywhere. The attention inside each block calls one replaceable function
``attn_fn(q, k, v, is_causal=True)`` on tensors shaped (batch, heads, seq, d_head), so other
stages can swap in SDPA, FlashAttention-2 in Triton, or an NVTX-annotated variant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# The course's editions: the model table (and the grids) differ; 2026 is the current one.
EDITIONS = (2026, 2025)
DEFAULT_EDITION = 2026
# edition -> size name -> (d_model, d_ff, num_layers, num_heads); vocab 10000 and batch 4
# throughout the study. 2026's xl is 2025's "2.7B"; 2025's xl (1600/6400/48/25) is gone.
# Planning reads this literal without torch (planning/imports.py: module_literal).
SIZE_TABLES: dict[int, dict[str, dict[str, int]]] = {
    2026: {
        "small": {"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
        "medium": {"d_model": 1024, "d_ff": 4096, "num_layers": 24, "num_heads": 16},
        "large": {"d_model": 1280, "d_ff": 5120, "num_layers": 36, "num_heads": 20},
        "xl": {"d_model": 2560, "d_ff": 10240, "num_layers": 32, "num_heads": 32},
        "10B": {"d_model": 4608, "d_ff": 12288, "num_layers": 50, "num_heads": 36},
    },
    2025: {
        "small": {"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
        "medium": {"d_model": 1024, "d_ff": 4096, "num_layers": 24, "num_heads": 16},
        "large": {"d_model": 1280, "d_ff": 5120, "num_layers": 36, "num_heads": 20},
        "xl": {"d_model": 1600, "d_ff": 6400, "num_layers": 48, "num_heads": 25},
        "2.7B": {"d_model": 2560, "d_ff": 10240, "num_layers": 32, "num_heads": 32},
    },
}
# the default edition's table (public: the course adapters and older callers read it)
MODEL_SIZES: dict[str, dict[str, int]] = SIZE_TABLES[DEFAULT_EDITION]
# A model small enough for a laptop CPU run of the whole pipeline in minutes (every edition).
EXTRA_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 128, "d_ff": 512, "num_layers": 2, "num_heads": 4},
}
VOCAB_SIZE = 10_000
BATCH_SIZE = 4

AttentionFn = Callable[..., torch.Tensor]
# how TransformerLM runs its stack of blocks: (blocks, x) -> x; core.checkpoint_plans swaps in
# arrangements of torch.utils.checkpoint
BlocksFn = Callable[[nn.ModuleList, torch.Tensor], torch.Tensor]


def edition_of(edition: int | str | None) -> int:
    """An edition as an int (2026, 2025); None is the default edition."""
    if edition is None:
        return DEFAULT_EDITION
    try:
        value = int(edition)
    except (TypeError, ValueError):
        value = None
    if value not in EDITIONS:
        raise ValueError(f"unknown edition {edition!r}; known: {', '.join(map(str, EDITIONS))}")
    return value


def size_names(edition: int | str | None = None) -> list[str]:
    """The size names of `edition` (its table, then the extra sizes)."""
    return [*SIZE_TABLES[edition_of(edition)], *EXTRA_SIZES]


def size_spec(name: str, edition: int | str | None = None) -> dict[str, int]:
    """d_model, d_ff, num_layers, num_heads of size `name` in `edition` (default: 2026)."""
    table = SIZE_TABLES[edition_of(edition)]
    if name in table:
        return table[name]
    if name in EXTRA_SIZES:
        return EXTRA_SIZES[name]
    raise ValueError(
        f"unknown model size {name!r} in the {edition_of(edition)} edition; "
        f"known: {', '.join(size_names(edition))}"
    )


def run_in_order(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    """The plain stack: every block once, in order, saving what autograd needs."""
    for block in blocks:
        x = block(x)
    return x


def naive_attention(q, k, v, is_causal: bool = True) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V, materializing the (seq x seq) score matrix."""
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(diagonal=n_k - n_q)
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs @ v


def sdpa_attention(q, k, v, is_causal: bool = True) -> torch.Tensor:
    """PyTorch's fused scaled_dot_product_attention (it picks its own backend)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


ATTENTION_FUNCTIONS: dict[str, AttentionFn] = {"naive": naive_attention, "sdpa": sdpa_attention}


def get_attention_fn(name: str) -> AttentionFn:
    """An attention implementation by name: the model's own (`naive`, `sdpa`) or one a module
    registered on import (`kernels.flash_triton`: `flash_triton`; `profiling.annotated_attention`:
    `naive_annotated`). `cs336_systems.kernels.attention.attention_function` imports on demand."""
    if name not in ATTENTION_FUNCTIONS:
        raise ValueError(f"unknown attention {name!r}; known: {sorted(ATTENTION_FUNCTIONS)}")
    return ATTENTION_FUNCTIONS[name]


def _init_linear(layer: nn.Linear) -> nn.Linear:
    d_out, d_in = layer.weight.shape
    std = math.sqrt(2.0 / (d_in + d_out))
    nn.init.trunc_normal_(layer.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
    return layer


def linear(d_in: int, d_out: int) -> nn.Linear:
    return _init_linear(nn.Linear(d_in, d_out, bias=False))


class RMSNorm(nn.Module):
    """x / rms(x) * g, computed in fp32 and cast back to the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x32 = x.float()
        rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * rms * self.weight.float()).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each (even, odd) pair of a head's features by position * theta^(-2i/d)."""

    def __init__(self, d_head: int, context_length: int, theta: float = 10000.0):
        super().__init__()
        if d_head % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {d_head}")
        inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        seq = x.shape[-2]
        cos = self.cos[:seq] if positions is None else self.cos[positions]
        sin = self.sin[:seq] if positions is None else self.sin[positions]
        x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
        rot_even = x_even * cos - x_odd * sin
        rot_odd = x_even * sin + x_odd * cos
        return torch.stack((rot_even, rot_odd), dim=-1).flatten(-2).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, rope: RotaryEmbedding):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.q_proj = linear(d_model, d_model)
        self.k_proj = linear(d_model, d_model)
        self.v_proj = linear(d_model, d_model)
        self.output_proj = linear(d_model, d_model)
        self.rope = rope
        self.attn_fn: AttentionFn = naive_attention

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.rope(self._heads(self.q_proj(x)))
        k = self.rope(self._heads(self.k_proj(x)))
        v = self._heads(self.v_proj(x))
        out = self.attn_fn(q, k, v, is_causal=True)
        return self.output_proj(out.transpose(1, 2).reshape(b, n, d))


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = linear(d_model, d_ff)
        self.w2 = linear(d_ff, d_model)
        self.w3 = linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, rope: RotaryEmbedding):
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads, rope)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)
        # core.checkpoint_plans: keep only the FFN half's input and recompute the half in backward
        self.checkpoint_ffn = False
        # core.checkpoint_plans: the same for the attention half (first norm and attention)
        self.checkpoint_attn = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_attn:
            x = x + checkpoint(self._attn_half, x, use_reentrant=False)
        else:
            x = x + self._attn_half(x)
        if self.checkpoint_ffn:
            return x + checkpoint(self._ffn_half, x, use_reentrant=False)
        return x + self._ffn_half(x)

    def _attn_half(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.ln1(x))

    def _ffn_half(self, x: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        nn.init.trunc_normal_(self.token_embeddings.weight, std=1.0, a=-3.0, b=3.0)
        rope = RotaryEmbedding(d_model // num_heads, context_length, rope_theta)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, rope) for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model)
        self.lm_head = linear(d_model, vocab_size)
        self.run_blocks: BlocksFn = run_in_order

    def set_attention(self, fn: AttentionFn | str) -> TransformerLM:
        """Swap the attention function of every block (a name from ATTENTION_FUNCTIONS or a callable)."""
        fn = get_attention_fn(fn) if isinstance(fn, str) else fn
        for layer in self.layers:
            layer.attn.attn_fn = fn
        return self

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if token_ids.shape[-1] > self.context_length:
            raise ValueError(
                f"sequence of {token_ids.shape[-1]} tokens exceeds context_length {self.context_length}"
            )
        x = self.run_blocks(self.layers, self.token_embeddings(token_ids))
        return self.lm_head(self.ln_final(x))


def build_model(
    size: str,
    context_length: int,
    vocab_size: int = VOCAB_SIZE,
    edition: int | str | None = None,
) -> TransformerLM:
    return TransformerLM(
        vocab_size=vocab_size, context_length=context_length, **size_spec(size, edition)
    )


def make_optimizer(model: nn.Module, lr: float = 1e-4) -> torch.optim.Optimizer:
    """AdamW, fused on CUDA."""
    on_cuda = next(model.parameters()).is_cuda
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=on_cuda)


def optimizer_impl(optimizer: torch.optim.Optimizer) -> str:
    """The implementation `optimizer.step()` runs, as `<class>_<fused|foreach|forloop>` (e.g.
    `adamw_fused`): the same optimizer can differ several-fold in time and temporary memory by
    implementation, so a row records which one it timed. A wrapper holding the optimizer it
    steps as `local_optimizer` (the sharded optimizer) reports that one's."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    inner = getattr(optimizer, "local_optimizer", None) or optimizer
    d = inner.defaults
    if d.get("fused"):
        impl = "fused"
    elif d.get("foreach") is not None:
        impl = "foreach" if d["foreach"] else "forloop"
    else:  # torch's own choice when neither is given
        params = [p for g in inner.param_groups for p in g["params"]]
        foreach = _default_to_fused_or_foreach(params, bool(d.get("differentiable")), False)[1]
        impl = "foreach" if foreach else "forloop"
    return f"{type(inner).__name__.lower()}_{impl}"
