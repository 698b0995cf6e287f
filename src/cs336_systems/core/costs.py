"""Every FLOP count the report uses, in one place, so every TFLOP/s and MFU figure is traceable.

Conventions: a multiply-add is 2 FLOPs. Backward costs 2x forward for matmuls, so a
forward+backward (or a training step; AdamW's elementwise work is negligible) is 3x forward.
"""

from __future__ import annotations

from math import ceil, inf, nan, sqrt
from typing import NamedTuple

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
    vocab_size: int, d_model: int, num_layers: int, d_ff: int, batch: int, seq: int, mode: str
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


# ---- the measured peaks MFU is taken against ------------------------------------------

# the ceiling each precision's MFU must be taken against: the path the model's matmuls take
# (fp32: a plain fp32 matmul; bf16: autocast F.linear on fp32 weights and inputs)
MODEL_PATH = {"fp32": "matmul", "bf16": "autocast_linear"}
PATH_LABEL = {
    "matmul": "a plain matmul",
    "autocast_linear": "autocast F.linear on fp32 weights and inputs",
}


# the vendors' datasheet peaks, TFLOP/s per GPU, dense (half the "with sparsity" figure), at
# the boost clock, by a part of the device name torch reports (the first that matches, most
# specific first). fp32 is the CUDA cores' rate: the model's fp32 matmuls run without TF32
# (kernel names `*ffma*`); bf16 the tensor cores'. A device not listed has no datasheet MFU.
DATASHEET_TFLOPS = {
    "H100 80GB HBM3": {"fp32": 67.0, "bf16": 989.5},  # H100 SXM5
    "H100 SXM": {"fp32": 67.0, "bf16": 989.5},
    "H100 NVL": {"fp32": 60.0, "bf16": 835.5},
    "H100 PCIe": {"fp32": 51.0, "bf16": 756.5},
    "H200 NVL": {"fp32": 60.0, "bf16": 835.5},
    "H200": {"fp32": 67.0, "bf16": 989.5},  # H200 SXM
    "A100": {"fp32": 19.5, "bf16": 312.0},
}


def datasheet_peak(device_name, precision: str) -> float:
    """The datasheet's dense TFLOP/s of `precision` on the device named `device_name` (a
    provenance column), NaN where the device or the precision is not listed."""
    name = str(device_name or "")
    for part, peaks in DATASHEET_TFLOPS.items():
        if part in name:
            return float(peaks.get(str(precision), float("nan")))
    return float("nan")


def matmul_peaks(ceilings: pd.DataFrame | None, path: str = "matmul") -> dict[str, float]:
    """Measured matmul TFLOP/s per dtype through `path` (old CSVs: every row is a plain matmul)."""
    if ceilings is None or len(ceilings) == 0 or "kind" not in ceilings:
        return {}
    c = ceilings[(ceilings["kind"] == "matmul") & (ceilings["status"] == "ok")]
    paths = c["path"].fillna("matmul") if "path" in c else pd.Series("matmul", index=c.index)
    c = c[paths == path]
    return {str(k): float(v) for k, v in c.groupby("dtype")["tflops"].max().items()}


# ---- training state per rank: DDP, optimizer-state sharding, FSDP ----------------------------

MEMORY_SCHEMES = ("ddp", "sharded_optimizer", "fsdp")


def training_state_bytes(
    sharded: int, replicated: int, world: int, scheme: str,
    param_bytes: int = 4, grad_bytes: int = 4, state_bytes: int = 8,
) -> float:  # fmt: skip
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


# ---- activation memory and checkpointing ------------------------------------------------------

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def block_saved_bytes(
    batch: int, seq: int, d_model: int, num_heads: int, d_ff: int,
    precision: str = "fp32", device_type: str = "cuda",
) -> dict[str, int]:  # fmt: skip
    """Bytes one eager TransformerBlock of our model saves for backward (naive attention,
    RMSNorm in fp32, SwiGLU, RoPE; parameters and RoPE tables excluded), split into its input
    (``input``: the residual stream it reads, b n d fp32) and the rest (``inner``).

    fp32, in elements (b batch, n seq, d d_model, f d_ff, h heads):
      each RMSNorm: rsqrt (b n), x * rsqrt (b n d) and its output (b n d, which the projections
      read); the second norm's input x + attn(x) (b n d); attention: RoPE'd q and k, a
      contiguous v, the output projection's input (4 b n d), softmax output (b h n^2), the
      causal mask (n^2 bools); SwiGLU: w1 x, silu(w1 x), w3 x and their product (4 b n f).
      inner = 4 (9 bnd + 4 bnf + b h n^2 + 2 bn) + n^2, input = 4 bnd.
    bf16 autocast: the norms stay fp32 but their outputs are not saved (each matmul saves its
    own bf16 copy of its input: q, k, v and w1, w3 each cast the same norm output, 3 + 2
    copies, plus the output projection's and w2's inputs); q, k, v and the SwiGLU terms are
    bf16; softmax runs in fp32 on CUDA (4-byte probabilities and the 2-byte copy PV reads), in
    bf16 on CPU; autocast's bf16 copies of the block's weights (2 bytes per matmul parameter,
    ``weight_casts``) are saved too.
      inner = 4 (2 bnd + 2 bn) + 4 bnd + 2 (3 + 3 + 1 + 2) bnd + 2 * 4 bnf + (4 + 2 | 2) b h n^2
              + n^2 + 2 (4 d^2 + 3 d f).
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}; known: fp32, bf16")
    b, n, d, f, h = batch, seq, d_model, d_ff, num_heads
    bnd, bnf, bhnn, bn = b * n * d, b * n * f, b * h * n * n, b * n
    if precision == "fp32":
        norms = 2 * 4 * (bn + 2 * bnd) + 4 * bnd  # rsqrt, x*rsqrt, output; ln2's input
        matmuls = 4 * (4 * bnd + 4 * bnf)  # q, k, v, o-proj input; SwiGLU's four
        scores = 4 * bhnn
        casts = 0
    else:
        norms = 2 * 4 * (bn + bnd) + 4 * bnd
        # bf16 casts of the norm outputs (3 + 2), q, k, v, o-proj input; SwiGLU's four
        matmuls = 2 * ((3 + 3 + 1 + 2) * bnd + 4 * bnf)
        scores = (4 + 2 if device_type == "cuda" else 2) * bhnn
        casts = 2 * (4 * d * d + 3 * d * f)
    inner = norms + matmuls + scores + n * n + casts
    return {"input": 4 * bnd, "inner": inner, "total": 4 * bnd + inner, "weight_casts": casts}


def head_saved_bytes(
    batch: int, seq: int, d_model: int, vocab_size: int, precision: str = "fp32"
) -> int:
    """Bytes saved after the blocks: the final RMSNorm (its input, rsqrt, x * rsqrt, fp32), the
    LM head's input (the norm's fp32 output; under autocast a bf16 copy, and the head's weight
    cast), and the loss (log-softmax output b n V in fp32, nll's total weight)."""
    b, n, d, v = batch, seq, d_model, vocab_size
    norm = 4 * (2 * b * n * d + b * n)
    head = 4 * b * n * d if precision == "fp32" else 2 * b * n * d + 2 * d * v
    return norm + head + 4 * b * n * v + 4


def _is_group(item) -> bool:
    return isinstance(item, tuple)


def _blocks(plan) -> int:
    return sum(_blocks(i) if _is_group(i) else 1 for i in plan)


def checkpoint_memory(
    plan: tuple,
    block_bytes: int,
    boundary_bytes: int,
    head_bytes: int = 0,
    cached_bytes: int = 0,
) -> dict[str, float]:
    """Peak bytes of saved activations of a training step whose blocks run as `plan` arranges
    them (core/checkpoint_plans.py: a tuple of block indices and checkpointed sub-tuples), and the
    block forwards it recomputes.

    Each block saves B = `block_bytes`, of which a = `boundary_bytes` is its input; a checkpoint
    call saves only its input (a). Forward ends holding what the outer level saves plus the
    head's H: fwd = sum over top-level items (a + (B - a) if a block) + H. Backward walks each
    level in reverse; a checkpointed item is recomputed first, its own items saved as above
    (its first input is already held), then walked the same way. While item i of a level is
    walked, what items 1..i of every enclosing level saved is alive:

        peak = max(fwd, max over blocks of the sum of what every level holds at that point)

    One level of N/k segments of k blocks: fwd = (N/k) a + H, backward (N/k - 1) a + k B:
    memory ~ N a / k + k B, minimal at k = sqrt(N a / B) (O(sqrt N) when a ~ B), recomputing N
    blocks. Recursive halving: one input per level alive, about a log2 N + B, recomputing
    N log2 N blocks. Nested prefixes (``chain``): a + B, recomputing N (N - 1) / 2 blocks.
    Under autocast, each block's weight casts (`cached_bytes`, part of B) stay in autocast's
    cache until the forward ends, saved or not: a checkpointed block adds them to fwd.
    Gradients, the optimizer and transient buffers of backward are not in this count.
    """
    a, inner = boundary_bytes, block_bytes - boundary_bytes

    def cost(item, new_input: bool) -> int:
        return (a if new_input else 0) + (0 if _is_group(item) else inner)

    def walk(items: tuple, held: float, top: bool) -> float:
        peak, level = 0.0, held
        for i, item in enumerate(items):
            level += cost(item, top or i > 0)
            # walked in reverse: while item i is, items 0..i are still held
            peak = max(peak, walk(item, level, False) if _is_group(item) else level)
        return peak

    plain = sum(not _is_group(item) for item in plan)
    forward = (
        sum(cost(item, True) for item in plan) + head_bytes + cached_bytes * (_blocks(plan) - plain)
    )
    recomputed = 0

    def count(items: tuple) -> None:
        nonlocal recomputed
        for item in items:
            if _is_group(item):
                recomputed += _blocks(item)
                count(item)

    count(plan)
    backward = walk(plan, 0.0, True)
    return {
        "forward_bytes": float(forward),
        "backward_bytes": float(backward),
        "peak_bytes": float(max(forward, backward)),
        "recomputed_blocks": recomputed,
        "blocks": _blocks(plan),
        # forward + backward ~ 3 forwards per block; each recomputed block adds one
        "compute_factor": (3 * _blocks(plan) + recomputed) / (3 * _blocks(plan)),
    }


# ---- communication arithmetic (2026 handout, section 8): one SwiGLU FFN ----------------------
#
# The handout's setting: N devices, each pair linked, each device sends W bytes/s (egress);
# a device computes C FLOP/s; x: (B, D), W1, W2: (D, D_FF), W3: (D_FF, D); weights and
# activations FP16 (2 bytes); only matmuls count ((A, B)(B, C) is 2ABC FLOPs). Compute and
# communication overlap, so a pass is communication-bound when its communication time exceeds
# its compute time. Every function returns {quantity: Quantity(value, unit, formula)}, the
# formula being the one the value was computed from (per device, in seconds, FLOPs, bytes).

FP16 = 2  # bytes per element of weights and activations in the handout's problems
MiB = 2**20  # bytes in a MiB: every `_mb` column counts 2**20 bytes (print it as MiB, not MB)


class Quantity(NamedTuple):
    """One answer, numeric and symbolic: the value, its unit and the formula it came from."""

    value: float
    unit: str
    formula: str


def ring_all_gather_time(s_bytes: float, n: int, w: float) -> float:
    """Ring all-gather (and reduce-scatter) of S bytes over N devices: (N-1)/N S/W seconds."""
    return (n - 1) / n * s_bytes / w


def ring_all_reduce_time(s_bytes: float, n: int, w: float) -> float:
    """Ring all-reduce = reduce-scatter + all-gather: 2 (N-1)/N S/W seconds."""
    return 2 * (n - 1) / n * s_bytes / w


def alternate_ring_all_reduce(s_bytes: float, n: int, w: float) -> dict[str, Quantity]:
    """Problem alternate_ring_all_reduce: T = (N-1) S / W.

    In each of the N-1 steps every device forwards a whole tensor x of S bytes (not a chunk of
    S/N) to its right neighbour at W bytes/s, so each step takes S/W. Against the
    reduce-scatter + all-gather ring (2 (N-1)/N S/W) it is N/2 times slower."""
    t = (n - 1) * s_bytes / w
    ring = ring_all_reduce_time(s_bytes, n, w)
    return {
        "time": Quantity(t, "s", "(N-1) S / W"),
        "ring_time": Quantity(ring, "s", "2 (N-1)/N S / W"),
        "slowdown": Quantity(t / ring, "x", "N / 2"),
    }


def overhead_model(s_bytes: float, w_bps: float, o_s: float, n_b: float) -> float:
    """DDP's bucket-size model (parallel/ddp.py, DDPBucketed): seconds of communication left
    after backward with `n_b` equal buckets of `s_bytes` in all, all-reduce bandwidth `w_bps` and
    a cost `o_s` per call, when each bucket takes as long to compute as to communicate:
    s / (n_b w) + n_b o (the last bucket's transfer plus one call cost per bucket that the
    communication stream falls behind)."""
    return s_bytes / (n_b * w_bps) + n_b * o_s


def optimal_bucket(s_bytes: float, w_bps: float, o_s: float) -> dict:
    """The minimum of `overhead_model`: n_b* = sqrt(s / (w o)), bucket size sqrt(s w o) (MiB),
    overhead 2 sqrt(s o / w) (ms)."""
    if o_s <= 0 or w_bps <= 0:
        return {"n_b": nan, "bucket_mb": nan, "overhead_ms": nan}
    n_b = sqrt(s_bytes / (w_bps * o_s))
    return {
        "n_b": n_b,
        "bucket_mb": sqrt(s_bytes * w_bps * o_s) / MiB,
        "overhead_ms": 2 * sqrt(s_bytes * o_s / w_bps) * 1e3,
    }


def ffn_flops(b: int, d: int, d_ff: int) -> dict[str, float]:
    """Matmul FLOPs of one SwiGLU FFN on B rows: forward three (B, D) x (D, D_FF)-sized
    matmuls, 6 B D D_FF; backward six (dz, dx's two, dW1, dW2, dW3), 12 B D D_FF."""
    return {"forward": 6.0 * b * d * d_ff, "backward": 12.0 * b * d * d_ff}


def ffn_comm_volumes(
    d: int, d_ff: int, n: int, scheme: str, elem_bytes: int = FP16, b: int = 0
) -> dict[str, dict[str, float]]:
    """Size S (bytes) of each collective one step of the FFN runs, per pass and kind:
    {pass: {kind: S}} with kind all_reduce, all_gather (the gathered size) or reduce_scatter
    (the input's size); the bytes a device sends follow from the ring times above.

    dp: backward all-reduces the three weight gradients, S = 3 D D_FF b.
    fsdp: forward all-gathers the three weights (S = 3 D D_FF b); backward gathers them again
    and reduce-scatters their gradients (S each).
    tp: forward all-reduces y, backward all-reduces dx: S = B D b each (B rows per device).
    """
    weights = 3.0 * d * d_ff * elem_bytes
    if scheme == "dp":
        return {"forward": {}, "backward": {"all_reduce": weights}}
    if scheme == "fsdp":
        return {
            "forward": {"all_gather": weights},
            "backward": {"all_gather": weights, "reduce_scatter": weights},
        }
    if scheme == "tp":
        act = float(b) * d * elem_bytes
        return {"forward": {"all_reduce": act}, "backward": {"all_reduce": act}}
    raise ValueError(f"unknown scheme {scheme!r}; known: dp, fsdp, tp")


def comm_time(volumes: dict[str, float], n: int, w: float) -> float:
    """Seconds of a pass's collectives run one after another on the ring model."""
    t = 0.0
    for kind, s in volumes.items():
        ring = ring_all_reduce_time if kind == "all_reduce" else ring_all_gather_time
        t += ring(s, n, w)
    return t


def data_parallel(b: int, d: int, d_ff: int, n: int, c: float, w: float) -> dict[str, Quantity]:
    """Problem data_parallel_calcs (FP16), per device, B the global batch (rows of x):

    (a) backward FLOPs 12 B D D_FF / N_DP (six matmuls on B/N_DP rows);
    (b) backward communication: a ring all-reduce of the three gradients, S = 6 D D_FF bytes:
        T = 2 (N_DP-1)/N_DP 6 D D_FF / W = 12 (N_DP-1) D D_FF / (N_DP W) (~ 12 D D_FF / W);
    (c) compute-bound while 12 B D D_FF/(N C) >= 12 (N-1) D D_FF/(N W): N_DP <= 1 + B W / C
        (~ B W / C for large N)."""
    flops = ffn_flops(b, d, d_ff)["backward"] / n
    t_comm = comm_time(ffn_comm_volumes(d, d_ff, n, "dp")["backward"], n, w)
    return {
        "backward_flops": Quantity(flops, "FLOP", "12 B D D_FF / N_DP"),
        "backward_compute_time": Quantity(flops / c, "s", "12 B D D_FF / (N_DP C)"),
        "backward_comm_time": Quantity(t_comm, "s", "12 (N_DP-1) D D_FF / (N_DP W)"),
        "max_devices": Quantity(1 + b * w / c, "devices", "N_DP <= 1 + B W / C"),
        "max_devices_large_n": Quantity(b * w / c, "devices", "N_DP <= B W / C"),
    }


def fsdp(b: int, d: int, d_ff: int, n: int, c: float, w: float) -> dict[str, Quantity]:
    """Problem fsdp_calcs (FP16), per device:

    (a) FLOPs as data parallel: forward 6 B D D_FF / N_FSDP, backward 12 B D D_FF / N_FSDP;
    (b) forward all-gathers the weights (S = 6 D D_FF bytes): (N-1)/N 6 D D_FF / W; backward
        gathers them again and reduce-scatters the gradients: 12 (N-1) D D_FF / (N W);
    (c) both passes: compute-bound while N_FSDP <= 1 + B W / C (~ B W / C): communication and
        compute are both halved in forward, so the bound is the same."""
    flops = ffn_flops(b, d, d_ff)
    vol = ffn_comm_volumes(d, d_ff, n, "fsdp")
    out = {}
    for p, k in (("forward", 6), ("backward", 12)):
        out[f"{p}_flops"] = Quantity(flops[p] / n, "FLOP", f"{k} B D D_FF / N_FSDP")
        out[f"{p}_compute_time"] = Quantity(flops[p] / n / c, "s", f"{k} B D D_FF / (N_FSDP C)")
        out[f"{p}_comm_time"] = Quantity(
            comm_time(vol[p], n, w), "s", f"{k} (N_FSDP-1) D D_FF / (N_FSDP W)"
        )
        out[f"{p}_max_devices"] = Quantity(1 + b * w / c, "devices", "N_FSDP <= 1 + B W / C")
    out["max_devices_large_n"] = Quantity(b * w / c, "devices", "N_FSDP <= B W / C")
    return out


def tensor_parallel(b: int, d: int, d_ff: int, n: int, c: float, w: float) -> dict[str, Quantity]:
    """Problem tp_calcs (FP16; W1, W2 column-parallel, W3 row-parallel), per device:

    (a) backward: dz(i) = dy W3(i)^T; dx2(i) = dz(i) * f(x1(i)); dx1(i) = dz(i) * f'(x1(i)) *
        x2(i); dx = all-reduce_i(dx1(i) W1(i)^T + dx2(i) W2(i)^T); dW3(i) = z(i)^T dy;
        dW2(i) = x^T dx2(i); dW1(i) = x^T dx1(i);
    (b) forward 6 B D D_FF / N_TP, backward 12 B D D_FF / N_TP FLOPs;
    (c) one all-reduce of a (B, D) FP16 tensor per pass (y forward, dx backward):
        2 (N-1)/N 2 B D / W = 4 (N_TP-1) B D / (N_TP W) each;
    (d) forward compute-bound while N_TP <= 1 + 3 D_FF W / (2 C), backward while
        N_TP <= 1 + 3 D_FF W / C (independent of B: both sides scale with it)."""
    flops = ffn_flops(b, d, d_ff)
    vol = ffn_comm_volumes(d, d_ff, n, "tp", b=b)
    out = {}
    for p, k, bound, bound_f in (
        ("forward", 6, 1.5, "1 + 3 D_FF W / (2 C)"),
        ("backward", 12, 3.0, "1 + 3 D_FF W / C"),
    ):
        out[f"{p}_flops"] = Quantity(flops[p] / n, "FLOP", f"{k} B D D_FF / N_TP")
        out[f"{p}_compute_time"] = Quantity(flops[p] / n / c, "s", f"{k} B D D_FF / (N_TP C)")
        out[f"{p}_comm_time"] = Quantity(comm_time(vol[p], n, w), "s", "4 (N_TP-1) B D / (N_TP W)")
        out[f"{p}_max_devices"] = Quantity(
            1 + bound * d_ff * w / c, "devices", f"N_TP <= {bound_f}"
        )
    return out


def fsdp_tp(
    b: int, d: int, d_ff: int, n_fsdp: int, n_tp: int, c: float, w: float
) -> dict[str, Quantity]:
    """Problem fsdp_tp_calcs (FP16), forward pass, device (i, j) of N = N_FSDP N_TP:

    (a) FLOPs 6 B D D_FF / (N_FSDP N_TP);
    (b) FSDP axis: all-gather of the TP shards of three weights, S = 6 D D_FF / N_TP bytes:
        T_FSDP = (N_FSDP-1)/N_FSDP 6 D D_FF / (N_TP W); TP axis: all-reduce of y(i,j), S =
        2 B D / N_FSDP bytes: T_TP = 4 (N_TP-1) B D / (N_TP N_FSDP W); overlapped
        T = max(T_FSDP, T_TP), sharing the links T_FSDP + T_TP;
    (c) overlapped, each axis must hide behind compute on its own: N_FSDP <= 1 + B W / C and
        N_TP <= 1 + 3 D_FF W / (2 C), so N <= (1 + B W/C)(1 + 3 D_FF W/(2C))
        ~ 3 B D_FF W^2 / (2 C^2);
    (d) not overlapped: T_FSDP + T_TP <= 6 B D D_FF/(N C) is, exactly (times N W / (2 D)),
        3 D_FF (N_FSDP-1) + 2 B (N_TP-1) <= R = 3 B D_FF W / C; N = N_FSDP N_TP is largest
        where the line's two terms balance: N_FSDP = (R + 2B + 3 D_FF)/(6 D_FF), N_TP =
        (R + 2B + 3 D_FF)/(4 B), N <= (R + 2B + 3 D_FF)^2 / (24 B D_FF); a split below one
        device is clamped to 1 and the other axis takes the whole line (N_FSDP = 1: N <= 1 +
        R/(2B), TP alone). For large N this is N <= 3 B D_FF W^2 / (8 C^2), a quarter of (c)."""
    n = n_fsdp * n_tp
    flops = ffn_flops(b, d, d_ff)["forward"] / n
    t_fsdp = ring_all_gather_time(3.0 * d * d_ff * FP16 / n_tp, n_fsdp, w)
    t_tp = ring_all_reduce_time(float(b) * d * FP16 / n_fsdp, n_tp, w)
    f_best, tp_best = 1 + b * w / c, 1 + 1.5 * d_ff * w / c
    r = 3.0 * b * d_ff * w / c
    sf, st = (r + 2 * b + 3 * d_ff) / (6 * d_ff), (r + 2 * b + 3 * d_ff) / (4 * b)
    if sf < 1:
        sf, st = 1.0, 1 + r / (2 * b)
    elif st < 1:
        sf, st = 1 + r / (3 * d_ff), 1.0
    return {
        "forward_flops": Quantity(flops, "FLOP", "6 B D D_FF / (N_FSDP N_TP)"),
        "forward_compute_time": Quantity(flops / c, "s", "6 B D D_FF / (N_FSDP N_TP C)"),
        "fsdp_comm_time": Quantity(t_fsdp, "s", "6 (N_FSDP-1) D D_FF / (N_FSDP N_TP W)"),
        "tp_comm_time": Quantity(t_tp, "s", "4 (N_TP-1) B D / (N_TP N_FSDP W)"),
        "comm_time_overlapped": Quantity(max(t_fsdp, t_tp), "s", "max(T_FSDP, T_TP)"),
        "comm_time_serial": Quantity(t_fsdp + t_tp, "s", "T_FSDP + T_TP"),
        "best_n_fsdp": Quantity(f_best, "devices", "N_FSDP = 1 + B W / C"),
        "best_n_tp": Quantity(tp_best, "devices", "N_TP = 1 + 3 D_FF W / (2 C)"),
        "max_devices": Quantity(
            f_best * tp_best, "devices", "N <= (1 + B W / C)(1 + 3 D_FF W / (2 C))"
        ),
        "max_devices_large_n": Quantity(
            1.5 * b * d_ff * w * w / c**2, "devices", "N <= 3 B D_FF W^2 / (2 C^2)"
        ),
        "serial_best_n_fsdp": Quantity(
            sf, "devices", "N_FSDP = max(1, (R + 2 B + 3 D_FF) / (6 D_FF)), R = 3 B D_FF W / C"
        ),
        "serial_best_n_tp": Quantity(st, "devices", "N_TP = max(1, (R + 2 B + 3 D_FF) / (4 B))"),
        "serial_max_devices": Quantity(
            sf * st, "devices", "N <= (R + 2 B + 3 D_FF)^2 / (24 B D_FF) (a split >= 1 each)"
        ),
        "serial_max_devices_large_n": Quantity(
            0.375 * b * d_ff * w * w / c**2, "devices", "N <= 3 B D_FF W^2 / (8 C^2)"
        ),
    }


# ---- communication accounting (2025 handout, section 2.4): the XXL model on TPU v5p ----------


def xxl_accounting(
    d: int, d_ff: int, blocks: int, device_bytes: float, h100_bytes: float,
    c: float, w_ici: float, x: int, y: int, m_x: int, m_y: int, weight_bytes: int = 2,
) -> dict[str, Quantity]:  # fmt: skip
    """Problem communication_accounting: `blocks` blocks of two linears (D x D_FF, D_FF x D),
    no attention, embeddings or head; fp32 master weights, accumulated gradients and AdamW's
    two moments (16 B a parameter); bf16 activations and communication; B counts tokens.

    (a) P = 2 D D_FF L parameters; state 16 P bytes; each block saves the inputs of its two
        linears for backward, 2 (D + D_FF) bytes a token: 2 L (D + D_FF) bytes a token.
    (b) state, gradients and half the activations sharded over N: per device 16 P / N +
        A (1 + 1/N) / 2, A = 2 L (D + D_FF) b the device's activations (b its tokens); it fits
        M bytes from N >= (16 P + A/2) / (M - A/2), and only while A < 2 M.
    (c) forward, the Scaling Book's FSDP x TP (part 5): per layer T_math = 4 B D D_FF / (N C),
        T_FSDP = 4 D D_FF / (Y W_ici M_X) (gathering the bf16 weights' Y-shards over X),
        T_TP = 4 B D / (X W_ici M_Y); compute-bound when both are below T_math: B/X >=
        C / (W_ici M_X), i.e. a per-device batch b = B/(X Y) >= C / (W_ici M_X Y), and
        Y <= D_FF M_Y W_ici / C; the overall batch X Y b.
    (d) the same bound under changes that shrink it: more tensor parallelism (Y up to its
        bound at the same N), 8-bit weight all-gathers (weight_bytes 1: half T_FSDP)."""
    p, alpha = 2.0 * d * d_ff * blocks, c / w_ici
    state, act_tok = 16 * p, 2.0 * blocks * (d + d_ff)
    b_dev = alpha * weight_bytes / 2 / (m_x * y)
    a_dev = act_tok * b_dev
    n_min = (state + a_dev / 2) / (device_bytes - a_dev / 2) if a_dev < 2 * device_bytes else inf
    n_fit = ceil(n_min) if n_min < inf else inf
    return {
        "params": Quantity(p, "parameters", "P = 2 D D_FF L"),
        "state_bytes": Quantity(state, "bytes", "16 P"),
        "state_h100s": Quantity(state / h100_bytes, "GPUs", "16 P / 80 GB"),
        "activation_bytes_per_token": Quantity(act_tok, "bytes", "2 L (D + D_FF)"),
        "min_devices_state": Quantity(state / device_bytes, "devices", "N >= 16 P / M"),
        "max_tokens_per_device": Quantity(2 * device_bytes / act_tok, "tokens", "b < M / (L (D + D_FF))"),
        "alpha": Quantity(alpha, "FLOP/byte", "C / W_ici"),
        "batch_per_device": Quantity(b_dev, "tokens", "b >= C / (W_ici M_X Y)"),
        "batch": Quantity(b_dev * x * y, "tokens", "B = X Y b >= X C / (W_ici M_X)"),
        "max_tp": Quantity(d_ff * m_y / alpha, "devices", "Y <= D_FF M_Y W_ici / C"),
        "activation_bytes": Quantity(a_dev, "bytes", "2 L (D + D_FF) b"),
        "activation_h100s": Quantity(a_dev * x * y / h100_bytes, "GPUs", "X Y A / 80 GB"),
        "min_devices": Quantity(n_min, "devices", "N >= (16 P + A/2) / (M - A/2)"),
        "per_device_bytes": Quantity(
            state / n_fit + a_dev * (1 + 1 / n_fit) / 2, "bytes", "16 P / N + A (1 + 1/N) / 2",
        ),
    }  # fmt: skip


def step_memory_bytes(
    vocab_size: int, d_model: int, num_layers: int, num_heads: int, d_ff: int, batch: int,
    seq: int, mode: str, precision: str = "fp32", device_type: str = "cuda",
) -> dict[str, float]:  # fmt: skip
    """Bytes one step of `mode` needs on one device, before it runs: the fp32 training state
    (``training_state_bytes`` on one rank: parameters 4 B each; with backward their gradients,
    4 B; a train step AdamW's two moments, 8 B: 16 B per parameter) plus the activations saved
    for backward (``num_layers`` x ``block_saved_bytes`` + ``head_saved_bytes``; a forward
    with autograd on saves them too). Transient buffers (the logits' gradient, backward's
    scratch, the allocator's rounding) are not counted: a lower bound, so a point it admits may
    still end as an `oom` row, and one it refuses cannot run."""
    if mode not in MODE_MULTIPLIER:
        raise ValueError(f"unknown mode {mode!r}; known: {sorted(MODE_MULTIPLIER)}")
    n = param_count(vocab_size, d_model, num_layers, d_ff)
    grads = 4 if mode != "forward" else 0
    moments = 8 if mode == "train_step" else 0
    state = training_state_bytes(n, 0, 1, "ddp", 4, grads, moments)
    block = block_saved_bytes(batch, seq, d_model, num_heads, d_ff, precision, device_type)
    acts = num_layers * block["total"] + head_saved_bytes(
        batch, seq, d_model, vocab_size, precision
    )
    return {
        "state_bytes": float(state),
        "activation_bytes": float(acts),
        "total_bytes": float(state + acts),
    }


# ---- the 2026 full-step leaderboard -----------------------------------------------------------


def train_step_flops(
    vocab_size: int, d_model: int, num_layers: int, d_ff: int, batch: int, seq: int
) -> float:
    """The leaderboard's count of one causal training step: 6 N tokens over the matmul
    parameters, plus causal attention 3.5 (4 n^2 d_model / 2) per layer and sequence (forward
    4 n^2 d halved by the mask, forward + backward 3.5x forward: attention_flops)."""
    n = matmul_param_count(vocab_size, d_model, num_layers, d_ff)
    attention = num_layers * batch * 3.5 * (4.0 * seq * seq * d_model / 2)
    return 6.0 * n * batch * seq + attention
