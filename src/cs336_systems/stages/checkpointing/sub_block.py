"""Checkpointing inside a block (core/checkpoint_plans.py: ``attn``, ``ffn``, ``halves``): the
analytic peak of saved activations beside the whole-block strategies' (core/costs.py:
checkpoint_memory), by the same eager count of what a block saves (costs.block_saved_bytes).

A block saves its input a, what its attention half saves besides (``attn_inner``: the first
norm's tensors, q, k, v, the output projection's input, the (n x n) probabilities and mask), the
FFN half's input m (the residual after attention, fp32 like a) and what the FFN half saves
besides (``ffn_inner``: engine/memory_model.py ffn_half_bytes). A checkpointed half keeps only
its input. Forward ends holding every block's share and the head's H; backward walks the last
block first, its FFN half then its attention half, recomputing one checkpointed half at a time:

    attn:   forward = N (a + m + ffn_inner) + H; peak = forward - ffn_inner + attn_inner when that
            is larger (the FFN half's tensors are freed before the attention half is recomputed)
    ffn:    forward = N (a + attn_inner + m) + H; peak = forward + ffn_inner
    halves: forward = N (a + m) + H;              peak = forward + max(attn_inner, ffn_inner)

Compute: each recomputed half adds its share of the block's forward (ffn_share).
"""

from __future__ import annotations

from cs336_systems.engine.memory_model import StepShape, ffn_half_bytes, ffn_share


def step_shape(spec: dict, batch: int, seq: int, vocab: int, precision: str, device_type: str):
    """The engine's step shape for this stage's eager model (naive attention, one device)."""
    return StepShape(
        vocab_size=vocab, d_model=spec["d_model"], d_ff=spec["d_ff"],
        num_layers=spec["num_layers"], num_heads=spec["num_heads"], batch=batch, seq=seq,
        precision=precision, attention="naive", device_type=device_type,
    )  # fmt: skip


def halves(block: dict, s: StepShape) -> dict[str, float]:
    """A block's saved bytes by half (module doc): a, attn_inner, m, ffn_inner."""
    a = block["input"]
    ffn_inner = ffn_half_bytes(s)
    return {
        "a": a,
        "m": a,
        "ffn_inner": ffn_inner,
        "attn_inner": block["total"] - 2 * a - ffn_inner,
    }


def sub_block_memory(name: str, block: dict, head: float, s: StepShape) -> dict[str, float]:
    """Peak bytes of saved activations and the compute of checkpointing `name` (``attn``,
    ``ffn``, ``halves``) in each of the s.num_layers blocks, as checkpoint_memory words it."""
    h, n = halves(block, s), s.num_layers
    share = ffn_share(s)
    if name == "attn":
        forward = n * (h["a"] + h["m"] + h["ffn_inner"]) + head
        backward = forward - h["ffn_inner"] + h["attn_inner"]
        recomputed = n * (1 - share)
    elif name == "ffn":
        forward = n * (h["a"] + h["attn_inner"] + h["m"]) + head
        backward = forward + h["ffn_inner"]
        recomputed = n * share
    elif name == "halves":
        forward = n * (h["a"] + h["m"]) + head
        backward = forward + max(h["attn_inner"], h["ffn_inner"])
        recomputed = float(n)
    else:
        raise ValueError(f"not a sub-block strategy: {name!r}")
    return {
        "forward_bytes": float(forward),
        "backward_bytes": float(backward),
        "peak_bytes": float(max(forward, backward)),
        "recomputed_blocks": recomputed,
        "blocks": n,
        "compute_factor": (3 * n + recomputed) / (3 * n),
    }
