"""The memory stage's analytic model: the bytes autograd saves for backward in a step of our
model (`activation_memory`, beside which the measured saved bytes are reported), and the block
sizes of the tensors a step allocates (`known_tensor_sizes`), which name a snapshot's largest
allocations (`likely_tensor`)."""

from __future__ import annotations

from cs336_systems.core import costs as flops
from cs336_systems.model import VOCAB_SIZE, size_spec

PRECISIONS = ("fp32", "bf16")


def activation_memory(
    batch: int,
    seq: int,
    d_model: int,
    num_layers: int,
    num_heads: int,
    d_ff: int,
    vocab_size: int = VOCAB_SIZE,
    precision: str = "fp32",
    device_type: str = "cuda",
) -> dict[str, int]:
    """Bytes autograd keeps for backward after the forward pass and the loss of our model
    (naive attention, RMSNorm in fp32, SwiGLU, RoPE), per component.

    Per block, in elements (b batch, n seq, d d_model, f d_ff, h heads), fp32:
      RMSNorm x2: its input and x*rms (2 bnd each) and rms (bn); the normed output, shared by
      the projections that read it (bnd each); RoPE'd q, k and a contiguous v (3 bnd);
      softmax probabilities (b h n^2) and the causal mask (n^2 bools); the attention output
      before W_O (bnd); SwiGLU: w1 x, silu(w1 x), w3 x and their product (4 bnf).
      -> 4 * (10 bnd + 4 bnf + b h n^2 + 2 bn) + n^2 bytes.
    bf16 autocast: the residual stream and the norms stay fp32 (4 bytes), every matmul input
    is a bf16 copy made per matmul (q, k, v and w1, w3 each cast the same fp32 input: 3 + 2
    copies), matmul outputs are bf16; on CUDA softmax runs in fp32 (4-byte probabilities, then
    a 2-byte copy for the PV matmul), CPU autocast keeps it in bf16; autocast's cached bf16
    copies of the weights are saved too (2 bytes per matmul parameter).
    After the blocks: the final norm (2 bnd + bn fp32) and the LM head's input, and the loss:
    log-softmax output (b n V, fp32) and nll_loss's total weight (a scalar).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {PRECISIONS}")
    b, n, d, f, h, L, V = batch, seq, d_model, d_ff, num_heads, num_layers, vocab_size
    bnd, bnf, bhnn, bn = b * n * d, b * n * f, b * h * n * n, b * n
    mask = n * n
    if precision == "fp32":
        norms = 2 * (4 * 2 * bnd + 4 * bn)
        matmul_inputs = 4 * (bnd + 3 * bnd + bnd + bnd)  # ln1-out, q k v, attn-out, ln2-out
        scores = 4 * bhnn
        mlp = 4 * 4 * bnf
        head_input = 4 * bnd
        weight_casts = 0
    else:
        norms = 2 * (4 * 2 * bnd + 4 * bn)
        matmul_inputs = 2 * (3 * bnd + 3 * bnd + bnd + 2 * bnd)  # casts, q k v, attn-out, casts
        scores = (4 + 2 if device_type == "cuda" else 2) * bhnn
        mlp = 2 * 4 * bnf
        head_input = 2 * bnd
        weight_casts = 2 * flops.matmul_param_count(V, d, L, f)
    per_layer = norms + matmul_inputs + scores + mlp + mask
    final = 4 * 2 * bnd + 4 * bn + head_input
    loss = 4 * b * n * V + 4
    out = {
        "residual_stream": 4 * bnd,
        "attention_scores_per_layer": scores,
        "per_layer": per_layer,
        "layers": L * per_layer,
        "final_norm_and_head": final,
        "loss": loss,
        "weight_casts": weight_casts,
    }
    out["total"] = out["layers"] + final + loss + weight_casts
    return out


def activation_memory_for(
    size: str, context: int, batch: int, precision: str, device_type: str, edition=None
) -> dict[str, int]:
    s = size_spec(size, edition)
    return activation_memory(
        batch,
        context,
        s["d_model"],
        s["num_layers"],
        s["num_heads"],
        s["d_ff"],
        VOCAB_SIZE,
        precision,
        device_type,
    )


# ---- the tensors a step allocates, by size


def known_tensor_sizes(
    size: str, context: int, batch: int, precision: str, edition=None
) -> dict[str, list[int]]:
    """Block sizes (bytes, rounded up to the allocator's 512) of the tensors a step of this
    model allocates, by name, in fp32 and (under bf16 autocast) bf16."""
    s = size_spec(size, edition)
    b, n, d, f, h, V = batch, context, s["d_model"], s["d_ff"], s["num_heads"], VOCAB_SIZE
    widths = (4, 2) if precision == "bf16" else (4,)
    shapes = {
        "attention scores/probabilities (b·h·n²)": b * h * n * n,
        "logits / log-softmax / their grad (b·n·V)": b * n * V,
        "SwiGLU hidden (b·n·d_ff)": b * n * f,
        "residual-stream-sized activation (b·n·d)": b * n * d,
        "W1/W2/W3 weight-sized (d·d_ff)": d * f,
        "embedding/LM-head weight-sized (V·d)": V * d,
        "attention projection weight-sized (d²)": d * d,
    }
    out: dict[str, list[int]] = {
        name: [-(-(elems * w) // 512) * 512 for w in widths] for name, elems in shapes.items()
    }
    out["causal mask (n², bool)"] = [-(-(n * n) // 512) * 512]
    return out


def likely_tensor(size_bytes: int, known: dict[str, list[int]]) -> str:
    names = [name for name, sizes in known.items() if int(size_bytes) in sizes]
    return " or ".join(names)
