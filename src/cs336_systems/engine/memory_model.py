"""What a training step of the engine holds per rank, by the memory model of core/costs.py, and
the activation checkpointing it therefore picks, computed before anything is allocated.

Saved activations: core.costs.block_saved_bytes counts an eager block with naive attention; a
fused attention (flash_triton, sdpa's flash/efficient backends) saves no (seq x seq) scores or
mask but its output O (2 b n d under bf16, 4 under fp32) and the per-row logsumexp L (4 b h n).
Under FSDP the block's weights are gathered in the compute dtype and freed after the block (no
autocast weight casts saved). The head with the fused loss saves the final norm's tensors, the
hidden states in the compute dtype, the head weight's cast and a logsumexp per token (no b n V
logits), plus one chunk's logits (compute dtype and fp32) while it runs.
Training state: core.costs.training_state_bytes (fp32 master weights, fp32 grads, AdamW's two
fp32 moments) for the scheme. With bf16 working weights (`master_weights`, one rank): each matmul
weight holds an fp32 master, a bf16 working copy, a bf16 grad and the two fp32 moments
(4 + 2 + 2 + 8 = 16 B, as before) but autocast makes no bf16 copies of it (the blocks'
``weight_casts`` and the head's weight cast are not saved). What this omits (allocator fragmentation, backward's transient
buffers, the optimizer's foreach temporaries) is the `margin` fraction left free.
"""

from __future__ import annotations

from dataclasses import dataclass

from cs336_systems.core import costs
from cs336_systems.core.checkpoint_plans import mixed_counts, mixed_name, plan_for

FUSED_ATTENTIONS = ("flash_triton", "sdpa", "sdpa_cudnn")
# fraction of free memory kept for what the model omits; 0.15 chose every_8 (+33% compute) for
# the 2026 xl at context 512, batch 4 on an 80 GB H100 (none: 67.9 GiB of 79 free, and the
# compiled plain step's measured peak is 56 GiB, below the model's 67.9)
MARGIN = 0.06


@dataclass(frozen=True)
class StepShape:
    vocab_size: int
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    batch: int  # per rank
    seq: int
    precision: str = "bf16"
    attention: str = "flash_triton"
    device_type: str = "cuda"
    world: int = 1
    scheme: str = "single"  # single | fsdp | sharded_optimizer
    master_weights: bool = False  # bf16 Linear weights + fp32 masters (engine/master_adamw.py)

    @property
    def params(self) -> tuple[int, int]:
        """(sharded, replicated) parameter counts: 2-D weights, norm gains."""
        d, f, v, n = self.d_model, self.d_ff, self.vocab_size, self.num_layers
        sharded = 2 * v * d + n * (4 * d * d + 3 * d * f)
        return sharded, n * 2 * d + d


def block_bytes(s: StepShape) -> dict[str, int]:
    """Saved bytes of one block (input, total) for this engine (module doc)."""
    base = costs.block_saved_bytes(
        s.batch, s.seq, s.d_model, s.num_heads, s.d_ff, s.precision, s.device_type
    )
    total = base["total"]
    b, n, d, h = s.batch, s.seq, s.d_model, s.num_heads
    if s.attention in FUSED_ATTENTIONS:
        per_score = 4 if s.precision == "fp32" else (6 if s.device_type == "cuda" else 2)
        total -= per_score * b * h * n * n + n * n
        total += (4 if s.precision == "fp32" else 2) * b * n * d + 4 * b * h * n
    if s.scheme == "fsdp" or s.master_weights:
        total -= base["weight_casts"]
    return {"input": base["input"], "total": total, "weight_casts": base["weight_casts"]}


def ffn_half_bytes(s: StepShape) -> int:
    """What a block's FFN half (second RMSNorm and SwiGLU) saves besides its input, by the
    eager count of costs.block_saved_bytes: the norm's rsqrt and x * rsqrt, the bf16 copies of
    its output that w1 and w3 read, SwiGLU's four b n d_ff terms. A block with the half
    checkpointed keeps the half's input instead (the same bytes as the norm's saved input)."""
    b, n, d, f = s.batch, s.seq, s.d_model, s.d_ff
    if s.precision == "fp32":
        return 4 * (b * n + 2 * b * n * d) + 16 * b * n * f
    return 4 * (b * n + b * n * d) + 2 * 2 * b * n * d + 2 * 4 * b * n * f


def ffn_share(s: StepShape) -> float:
    """The FFN half's share of a block's forward FLOPs (its three matmuls against the block's
    seven and its causal attention)."""
    b, n, d, f = s.batch, s.seq, s.d_model, s.d_ff
    ffn = costs.ffn_flops(b * n, d, f)["forward"]
    block = 2.0 * b * n * (4 * d * d + 3 * d * f) + 2.0 * b * n * n * d
    return ffn / block


def mixed_bytes(
    s: StepShape, plain: int, ffn: int, head: int, blk: dict[str, float] | None = None
) -> dict[str, float]:
    """Saved-activation peak and compute factor of ``mixed_p<plain>_f<ffn>`` (the last `plain`
    blocks plain, `ffn` before them with their FFN half checkpointed, the rest each
    checkpointed alone). `blk` gives a block's bytes (``plain``: all it saves, ``ffn``: with
    its FFN half checkpointed, ``input``: its input) where they were measured; by default the
    model's. Forward ends holding every block's share and the head's; backward then recomputes
    one block (or one FFN half) at a time on top of what is left: peak = forward + the largest
    recompute."""
    n = s.num_layers
    full = n - plain - ffn
    if blk is None:
        b = block_bytes(s)
        blk = {"plain": b["total"], "ffn": b["total"] - ffn_half_bytes(s), "input": b["input"]}
    forward = full * blk["input"] + ffn * blk["ffn"] + plain * blk["plain"] + head
    transient = 0.0
    if full:
        transient = blk["plain"] - blk["input"]
    elif ffn:
        transient = blk["plain"] - blk["ffn"]
    recomputed = full + ffn * ffn_share(s)
    return {"peak_bytes": forward + transient, "compute_factor": (3 * n + recomputed) / (3 * n)}


def head_bytes(s: StepShape, chunk: int) -> int:
    b, n, d, v = s.batch, s.seq, s.d_model, s.vocab_size
    elt = 4 if s.precision == "fp32" else 2
    norm = 4 * (2 * b * n * d + b * n)
    cast = 0 if s.precision == "fp32" else elt * (b * n * d + (0 if s.master_weights else d * v))
    return norm + cast + 4 * b * n + min(chunk, b * n) * v * (4 + elt)


def state_bytes(s: StepShape) -> float:
    sharded, replicated = s.params
    scheme = "ddp" if s.scheme == "single" else s.scheme
    if not s.master_weights:
        return costs.training_state_bytes(sharded, replicated, s.world, scheme)
    matmul = costs.matmul_param_count(s.vocab_size, s.d_model, s.num_layers, s.d_ff)
    rest = sharded + replicated - matmul
    working = costs.training_state_bytes(matmul, 0, 1, "ddp", param_bytes=4 + 2, grad_bytes=2)
    return working + costs.training_state_bytes(rest, 0, 1, "ddp")


def candidates(num_layers: int, selective: bool = True) -> list[str]:
    """Strategies by recomputation: none, one level (every_k, k | N; sqrt), nested; with
    `selective`, ``ffn`` and every ``mixed_p<P>_f<F>`` between none and every_1."""
    every = [f"every_{k}" for k in range(1, num_layers + 1) if num_layers % k == 0]
    mixed = []
    if selective:
        mixed = [
            mixed_name(p, f)
            for p in range(num_layers)
            for f in range(num_layers - p + 1)
            if (p, f) != (0, 0)
        ]
    return ["none", *every, "sqrt", "halving", "chain", "ffn", *mixed]


def step_bytes(
    s: StepShape, strategy: str, chunk: int, blk: dict[str, float] | None = None
) -> dict[str, float]:
    """Peak bytes per rank of one step under `strategy`, with its parts (`blk`: measured block
    bytes for the selective strategies, mixed_bytes)."""
    counts = mixed_counts(strategy, s.num_layers)
    if counts is not None:
        act = mixed_bytes(s, *counts, head_bytes(s, chunk), blk)
    else:
        b = block_bytes(s)
        cached = 0 if s.scheme == "fsdp" or s.master_weights else b["weight_casts"]
        act = costs.checkpoint_memory(
            plan_for(strategy, s.num_layers), b["total"], b["input"], head_bytes(s, chunk), cached
        )
    state = state_bytes(s)
    return {
        "strategy": strategy,
        "activations": act["peak_bytes"],
        "state": state,
        "total": act["peak_bytes"] + state,
        "compute_factor": act["compute_factor"],
    }


def choose_checkpointing(
    s: StepShape,
    free_bytes: float,
    chunk: int,
    selective: bool = True,
    blk: dict[str, float] | None = None,
) -> dict[str, float]:
    """The strategy with the least recomputation whose step fits (1 - MARGIN) of `free_bytes`
    (ties: the least memory); the least memory of all when none fits (``fits`` False).
    `selective`: consider ``ffn`` and ``mixed_*``; `blk`: their measured block bytes."""
    budget = free_bytes * (1 - MARGIN)
    rows = [step_bytes(s, name, chunk, blk) for name in candidates(s.num_layers, selective)]
    fitting = [r for r in rows if r["total"] <= budget]
    if fitting:
        best = min(fitting, key=lambda r: (round(r["compute_factor"], 9), r["total"]))
        return {**best, "fits": True, "budget": budget}
    return {**min(rows, key=lambda r: r["total"]), "fits": False, "budget": budget}


def shortfall(choice: dict, world: int) -> str | None:
    """`skipped: needs X GB per rank, have Y` when even the leanest plan does not fit."""
    if choice["fits"]:
        return None
    free = choice["budget"] / (1 - MARGIN)
    return need_message(choice["total"], free, f"world {world}, checkpointing {choice['strategy']}")


def plain_bytes(s: StepShape) -> dict[str, float]:
    """Peak bytes per rank of the plain model's step (naive attention, no checkpointing, full
    logits and their log-softmax, every weight, gradient and AdamW state on every rank)."""
    naive = StepShape(
        **{**s.__dict__, "attention": "naive", "scheme": "single", "master_weights": False}
    )
    blk = costs.block_saved_bytes(
        s.batch, s.seq, s.d_model, s.num_heads, s.d_ff, s.precision, s.device_type
    )
    head = costs.head_saved_bytes(s.batch, s.seq, s.d_model, s.vocab_size, s.precision)
    head += (2 if s.precision == "bf16" else 0) * s.batch * s.seq * s.vocab_size  # bf16 logits
    act = costs.checkpoint_memory(
        plan_for("none", s.num_layers), blk["total"], blk["input"], head, blk["weight_casts"]
    )
    state = state_bytes(naive)
    total = act["peak_bytes"] + state
    return {
        "strategy": "none",
        "activations": act["peak_bytes"],
        "state": state,
        "total": total,
        "fits": None,
    }


def need_message(total_bytes: float, free_bytes: float, what: str) -> str:
    return (
        f"skipped: needs {total_bytes / (1 - MARGIN) / 1e9:.1f} GB per rank, "
        f"have {free_bytes / 1e9:.1f} ({what})"
    )
