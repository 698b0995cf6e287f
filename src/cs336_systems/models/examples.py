"""A plain-torch model for the config's `own_model` key (docs/own-model.md), needing nothing
beyond torch: a causal convolution LM, a module the study's formulas know nothing of.

    own_model: {name: conv-lm, factory: "cs336_systems.models.examples:conv_lm"}
"""

from __future__ import annotations

import torch
from torch import nn


class ConvLM(nn.Module):
    """Token embedding -> `layers` x [causal depthwise-separable convolution + MLP, residual]
    -> LM head: token ids (B, T) -> logits (B, T, V)."""

    def __init__(self, vocab_size: int, d_model: int = 64, layers: int = 2, kernel: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.kernel = kernel
        self.convs = nn.ModuleList(
            nn.Conv1d(d_model, d_model, kernel, groups=d_model) for _ in range(layers)
        )
        self.mlps = nn.ModuleList(
            nn.Sequential(
                nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for conv, mlp in zip(self.convs, self.mlps):
            h = nn.functional.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # causal: left only
            x = x + mlp(conv(h).transpose(1, 2))
        return self.head(x)


def conv_lm(vocab_size: int) -> ConvLM:
    return ConvLM(vocab_size)
