"""Naive attention with profiler ranges around each of its parts.

The same computation as `model.naive_attention`, with an NVTX range (seen by Nsight Systems) and
a `record_function` range (seen by torch.profiler) around the whole call and around the QK^T
matmul, the 1/sqrt(d) scaling (an elementwise kernel of its own: inside the matmul's range it
would count as matmul time), the causal mask, the softmax and the PV matmul. Importing this module registers it as
``ATTENTION_FUNCTIONS["naive_annotated"]``, so ``model.set_attention("naive_annotated")`` swaps
it in without patching anything.
"""

from __future__ import annotations

import math

import torch

from cs336_systems.core.phases import annotate
from cs336_systems.model import ATTENTION_FUNCTIONS

ATTENTION_RANGE = "attention"
# the parts of attention, in execution order; range names are f"{ATTENTION_RANGE}.{part}"
ATTENTION_PARTS = ("qk_matmul", "scale", "mask", "softmax", "pv_matmul")


def annotated_naive_attention(q, k, v, is_causal: bool = True) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V, each part inside its own profiler range."""
    with annotate(ATTENTION_RANGE):
        d = q.shape[-1]
        with annotate(f"{ATTENTION_RANGE}.qk_matmul"):
            scores = q @ k.transpose(-2, -1)
        with annotate(f"{ATTENTION_RANGE}.scale"):
            scores = scores / math.sqrt(d)
        if is_causal:
            with annotate(f"{ATTENTION_RANGE}.mask"):
                n_q, n_k = q.shape[-2], k.shape[-2]
                mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(
                    diagonal=n_k - n_q
                )
                scores = scores.masked_fill(~mask, float("-inf"))
        with annotate(f"{ATTENTION_RANGE}.softmax"):
            probs = torch.softmax(scores, dim=-1)
        with annotate(f"{ATTENTION_RANGE}.pv_matmul"):
            return probs @ v


ATTENTION_FUNCTIONS["naive_annotated"] = annotated_naive_attention
