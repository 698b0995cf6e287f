"""Every FLOP count the report uses, in one place, so every TFLOP/s and MFU figure is traceable.

Conventions: a multiply-add is 2 FLOPs. Backward costs 2x forward for matmuls, so a
forward+backward (or a training step; AdamW's elementwise work is negligible) is 3x forward.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MODE_MULTIPLIER = {"forward": 1.0, "forward_backward": 3.0, "train_step": 3.0}


def param_count(vocab_size: int, d_model: int, num_layers: int, d_ff: int) -> int:
    """Parameters of TransformerLM: embedding, per block 4 d^2 (attention) + 3 d d_ff (SwiGLU)
    + 2 d (two RMSNorm gains), final RMSNorm, untied LM head."""
    per_block = 4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model
    return vocab_size * d_model + num_layers * per_block + d_model + d_model * vocab_size


def matmul_param_count(vocab_size: int, d_model: int, num_layers: int, d_ff: int) -> int:
    """Parameters that take part in a matmul: all but the embedding lookup and the norm gains."""
    return num_layers * (4 * d_model * d_model + 3 * d_model * d_ff) + d_model * vocab_size


def model_flops(
    vocab_size: int,
    d_model: int,
    num_layers: int,
    d_ff: int,
    batch: int,
    seq: int,
    mode: str,
) -> float:
    """FLOPs of one step: 2 N tokens for the weights (6 N tokens with backward) plus the attention
    term 4 b n^2 d per layer forward (QK^T and PV, full matrices as the naive model computes
    them; not halved for the causal mask, as in PaLM's MFU accounting)."""
    if mode not in MODE_MULTIPLIER:
        raise ValueError(f"unknown mode {mode!r}; known: {sorted(MODE_MULTIPLIER)}")
    n = matmul_param_count(vocab_size, d_model, num_layers, d_ff)
    forward = 2.0 * n * batch * seq + 4.0 * num_layers * batch * seq * seq * d_model
    return MODE_MULTIPLIER[mode] * forward


def attention_flops(
    batch: int, heads: int, n_queries: int, n_keys: int, d_head: int, causal: bool, pass_: str
) -> float:
    """Attention FLOPs: forward 4 b h n_q n_k d (QK^T and PV), halved when causal; backward
    2.5x forward (five matmuls instead of two); forward_backward 3.5x forward."""
    forward = 4.0 * batch * heads * n_queries * n_keys * d_head
    if causal:
        forward /= 2
    factor = {"forward": 1.0, "backward": 2.5, "forward_backward": 3.5}
    if pass_ not in factor:
        raise ValueError(f"unknown pass {pass_!r}; known: {sorted(factor)}")
    return forward * factor[pass_]


# softmax over a row: max, subtract, exp, sum, divide per element (the matmuls: 2 per MAC)
SOFTMAX_FLOPS_PER_ELEMENT = 5


def attention_flops_split(batch: int, heads: int, seq: int, d_head: int) -> dict[str, float]:
    """FLOPs of one forward naive attention call, per part: QK^T and PV are 2*b*h*n*n*d_head
    each; softmax SOFTMAX_FLOPS_PER_ELEMENT per score; the mask one (a select) per score."""
    scores = batch * heads * seq * seq
    return {
        "qk_matmul": 2.0 * scores * d_head,
        "pv_matmul": 2.0 * scores * d_head,
        "softmax": float(SOFTMAX_FLOPS_PER_ELEMENT * scores),
        "mask": float(scores),
    }


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")


# one all-reduce configuration: the points a latency-bandwidth fit runs over
ALLREDUCE_GROUP = ["backend", "buffers", "world_size"]


def fit_latency_bandwidth(df: pd.DataFrame) -> pd.DataFrame:
    """Fit t(bytes) = o + bytes / w per (backend, buffers, world size) to the median times.

    Least squares on relative error (each point weighted by 1/t), so the small messages fix
    the latency o and the large ones the bandwidth w; o is clipped at 0. w is an algorithmic
    bandwidth (bytes of the message per second), as the bucket-size model wants it.
    """
    rows = []
    if len(df) and "buffers" not in df:
        df = df.assign(buffers="default")
    d = df[df["status"] == "ok"]
    for key, g in d.groupby(ALLREDUCE_GROUP):
        g = g[g["time_ms_median"] > 0]
        if len(g) < 2:
            continue
        t = g["time_ms_median"].to_numpy() * 1e-3
        b = g["bytes"].to_numpy(dtype=float)
        a = np.stack([1 / t, b / t], axis=1)
        (o, inv_w), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if o < 0 or inv_w <= 0:
            o, inv_w = 0.0, float(np.mean(t / b))
        pred = o + b * inv_w
        rows.append(
            {
                **dict(zip(ALLREDUCE_GROUP, key, strict=True)),
                "latency_us": o * 1e6,
                "bandwidth_gbps": 1 / inv_w / 1e9,
                "max_rel_residual": float(np.max(np.abs(pred - t) / t)),
                "points": len(g),
            }
        )
    return pd.DataFrame(rows)


# ---- training state per rank: DDP, optimizer-state sharding, FSDP ----------------------------

MEMORY_SCHEMES = ("ddp", "sharded_optimizer", "fsdp")


def training_state_bytes(
    sharded: int,
    replicated: int,
    world: int,
    scheme: str,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    state_bytes: int = 8,
) -> float:
    """Bytes of parameters, gradients and optimizer state (AdamW: two fp32 moments, 8 B) that
    one of `world` ranks holds; `sharded`: parameters FSDP shards (Linear and Embedding
    weights), `replicated`: the rest (norm gains). Activations and communication buffers (FSDP's
    gathered weights) are not counted.

    ddp: everything on every rank; sharded_optimizer (ZeRO-1): the optimizer state split over
    the ranks; fsdp: the sharded weights' parameters, gradients and state split, the replicated
    ones whole."""
    n = sharded + replicated
    if scheme == "ddp":
        return n * (param_bytes + grad_bytes + state_bytes)
    if scheme == "sharded_optimizer":
        return n * (param_bytes + grad_bytes) + n * state_bytes / world
    if scheme == "fsdp":
        per = param_bytes + grad_bytes + state_bytes
        return sharded * per / world + replicated * per
    raise ValueError(f"unknown scheme {scheme!r}; known: {MEMORY_SCHEMES}")


def fsdp_saving_vs_optimizer_sharding(
    sharded: int, replicated: int, world: int, param_bytes: int = 4, grad_bytes: int = 4
) -> float:
    """Bytes per rank FSDP saves against optimizer-state sharding (all-gather buffers ignored):
    the sharded weights' parameters and gradients, (param_bytes + grad_bytes) (1 - 1/W) each,
    less the replicated parameters' optimizer state, which optimizer sharding splits and FSDP
    keeps whole: 8 (1 - 1/W) each."""
    return training_state_bytes(
        sharded, replicated, world, "sharded_optimizer", param_bytes, grad_bytes
    ) - training_state_bytes(sharded, replicated, world, "fsdp", param_bytes, grad_bytes)
