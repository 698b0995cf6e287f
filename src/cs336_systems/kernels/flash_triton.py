"""FlashAttention-2 with Triton kernels: the autograd Function (`FlashAttentionTriton`), the
model's attention entry point (`flash_attention`), the launchers of the forward and the backward
(`flash_forward_triton`, `flash_backward_triton`) and their custom ops for torch.compile.

Where the rest is: the kernels in `flash_triton_forward` and `flash_triton_backward` (Triton
language) and `hopper/` (Gluon, for Hopper GPUs); their shared helpers and the interpreter switch
in `flash_triton_common`; tiles in `flash_triton_configs` and `hopper/configs`; launching,
autotuning and tensor descriptors in `flash_triton_launch`.

Forward: one program per (query tile, batch x head) walks over K/V tiles with the online softmax;
O and the logsumexp L (natural log, fp32) are saved. Backward: D = rowsum(O * dO), then a
key-tile pass (dK, dV) and a query-tile pass (dQ), both recomputing P = exp(S - L), no atomics,
no (n x n) buffer. Any lengths, n_queries may differ from n_keys, 1 <= d <= 128, strided inputs,
fp16, bf16 and fp32 (TF32 tensor cores only when torch allows it); causal masking top-left
aligned. Tiles are autotuned on the GPU per (head dim, dtype, causal, power-of-two bucket of n);
``chosen_configs()`` reports what the last calls ran. Without CUDA the kernels run in Triton's
interpreter on CPU tensors.
"""

from __future__ import annotations

import torch

from cs336_systems.kernels import dispatch
from cs336_systems.kernels import flash_triton_launch as triton_launch
from cs336_systems.kernels.flash_pytorch import check_attention_inputs
from cs336_systems.kernels.flash_triton_common import DTYPES, INTERPRET, MAX_HEAD_DIM
from cs336_systems.kernels.flash_triton_configs import KERNELS

# what the last forward and the last backward call ran: per pass its configuration, and the plans
_CHOSEN: dict[str, dict] = {}
_PLANS: dict[str, dispatch.AttentionPlan] = {}


def _gluon():
    """The Gluon kernels' host side, imported when a plan first routes a pass to them. A plain
    import: a Gluon kernel module that fails to import (e.g. under a Triton whose Gluon API
    moved) is an error on the GPU that needs it, never a silent fallback."""
    import cs336_systems.kernels.hopper.launch as gluon_launch

    return gluon_launch


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """ValueError naming the shapes for anything the kernels cannot run correctly."""
    check_attention_inputs(q, k, v, dtypes=DTYPES, max_head_dim=MAX_HEAD_DIM)
    if q.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set before importing "
            f"this module); got tensors on {q.device} with q {tuple(q.shape)}"
        )
    if INTERPRET and q.device.type != "cpu":
        raise ValueError(f"Triton's interpreter runs on CPU tensors; got {q.device}")


def _record(done: dict[str, dict], plan: dispatch.AttentionPlan, passes) -> None:
    """Keep what ran for `chosen_configs()`, each configuration with its pass's reason."""
    for one in passes:
        if one.name in done:
            _CHOSEN[one.name] = {**done[one.name], "reason": one.reason}


def flash_forward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    blocks=None,
    use_desc: bool | None = None,
    use_gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward kernel on (batch, n, d) or (batch, heads, n, d); returns (O, L fp32).

    The kernel is the plan's (`kernels.dispatch.plan`): on Hopper, for 16-bit inputs at the
    head dims where it measured faster, the Gluon forward (FlashAttention-3's overlap of softmax
    and matrix products; any of 16/32/64/128 with `use_gluon=True`; not with `use_gluon=False`,
    `blocks` or `use_desc=False`); else the Triton-language kernel. `blocks` bypasses
    autotuning: (BLOCK_Q, BLOCK_K) (tests use it to exercise tile edges) or a dict that may add
    num_warps and num_stages. `use_desc` forces tensor descriptors on or off (default: on for
    16-bit inputs they fit, on Hopper or newer).
    """
    check_inputs(q, k, v)
    q4, k4, v4 = triton_launch.as_4d(q), triton_launch.as_4d(k), triton_launch.as_4d(v)
    d = q4.shape[-1]
    plan = dispatch.plan(
        q.dtype,
        d,
        dispatch.target_of(q.device),
        use_gluon=use_gluon,
        blocks=blocks,
        use_desc=use_desc,
        tensors=(q4, k4, v4),
    )
    _PLANS["forward"] = plan
    step = plan.forward
    if step.gluon:
        o, lse = _gluon().forward(q4, k4, v4, bool(is_causal), config=step.tiles)
        done = step.config()
    else:
        o, lse, done = triton_launch.forward(q4, k4, v4, bool(is_causal), step.tiles, use_desc)
    _record({"forward": done}, plan, [step])
    if q.dim() == 3:
        return o.squeeze(1), lse.squeeze(1)
    return o, lse


def flash_backward_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool = False,
    blocks=None,
    use_desc: bool | None = None,
    fuse_dq: bool = False,
    use_gluon: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward kernels: D = rowsum(O*dO), then a dK/dV pass and a separate dQ pass (the
    default: seven matmuls per tile pair, no atomics, deterministic) or, with `fuse_dq=True`, one
    pass that computes dK and dV and adds each tile's dQ into an fp32 accumulator (five
    matmuls; bulk tensor reductions with descriptors, atomics without). On an H100 the fused
    pass measured slower (docs/flash-attention-notes.md).

    `blocks`: as in flash_forward_triton, for every pass, or a dict with one entry per pass
    ("backward_dkdv" and "backward_dq", or "backward_fused"). The passes are the plan's
    (`kernels.dispatch.plan`): on Hopper the dK/dV and dQ passes are Gluon kernels where they
    are routed (as for the forward; not with `fuse_dq`, `blocks`, `use_desc=False` or
    `use_gluon=False`); a Gluon dQ pass runs first and computes D itself; a Gluon dK/dV
    configuration may compute dQ as well (FUSE_DQ, at d = 64: after the D kernel, into an fp32
    accumulator), and then no dQ pass runs.
    """
    q4, k4, v4, o4, do4 = (triton_launch.as_4d(x) for x in (q, k, v, o, do))
    b, h, n_q, n_k, d, d_pad = triton_launch.problem_shape(q4, k4, v4)
    for name in KERNELS[1:]:  # chosen_configs() names the passes this call runs
        _CHOSEN.pop(name, None)
    lse = lse.reshape(b, h, n_q).contiguous()
    delta = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    # gradients take their input's layout where it is dense (empty_like's preserve_format)
    dq, dk, dv = torch.empty_like(q4), torch.empty_like(k4), torch.empty_like(v4)
    do_given = do4
    broadcast = False  # dO is one row of d values repeated through zero strides
    if use_desc is not False and not triton_launch.descriptors_fit((do4,), d, d_pad):
        # e.g. the stride-0 gradient of o.sum(). The Gluon passes' TMA descriptors read a
        # (0, 0, 0, 1)-strided view of one row as it is; the Triton-language passes get one
        # dense copy (below, once the passes are planned)
        broadcast = all(s == 0 for s in do4.stride()[:-1])
        do4 = do4[:1, :1, :1].contiguous().expand(do4.shape) if broadcast else do4.contiguous()
    plan = dispatch.plan(
        q.dtype,
        d,
        dispatch.target_of(q.device),
        use_gluon=use_gluon,
        blocks=blocks,
        use_desc=use_desc,
        fuse_dq=fuse_dq,
        tensors=(q4, k4, v4, do4, dq, dk, dv),
        o=o4,
    )
    _PLANS["backward"] = plan
    if broadcast and not plan.gluon_backward:
        do4 = do_given.contiguous()
    desc = triton_launch.use_descriptors((q4, k4, v4, do4, dq, dk, dv), d, d_pad, use_desc)
    done = {}
    if plan.dq is not None and plan.dq.gluon:  # first: it computes D
        _gluon().backward_dq(
            q4, k4, v4, do4, lse, delta, dq, bool(is_causal), config=plan.dq.tiles, o=o4
        )
        done[plan.dq.name] = plan.dq.config()
    else:
        triton_launch.preprocess(o4, do_given, delta, plan.delta.tiles["BLOCK_Q"])

    step = plan.dkdv
    fused = step.name == "backward_fused"
    if step.gluon:  # dQ too where its configuration fuses it
        _gluon().backward_dkdv(
            q4, k4, v4, do4, lse, delta, dk, dv, bool(is_causal), config=step.tiles, dq=dq
        )
        done[step.name] = step.config()
    else:
        # dQ target: the fp32 accumulator (fused) or the output itself (its own pass)
        dq_target = (
            torch.zeros((b, h, n_q, d), dtype=torch.float32, device=q.device) if fused else dq
        )
        done[step.name] = triton_launch.backward_dkdv(
            q4, k4, v4, do4, lse, delta, dk, dv, dq_target, is_causal, desc, fused, step.tiles
        )
        if fused:
            dq.copy_(dq_target)
    if plan.dq is not None and not plan.dq.gluon:
        done[plan.dq.name] = triton_launch.backward_dq(
            q4, k4, v4, do4, lse, delta, dq, is_causal, desc, plan.dq.tiles
        )
    _record(done, plan, plan.backward)
    if q.dim() == 3:
        return dq.squeeze(1), dk.squeeze(1), dv.squeeze(1)
    return dq, dk, dv


def chosen_configs() -> dict[str, dict]:
    """The tile configuration of each pass that the last forward and the last backward call
    launched (autotuned on the GPU), with the plan's reason for its kernel."""
    return {name: dict(cfg) for name, cfg in _CHOSEN.items()}


def last_plans() -> dict[str, dispatch.AttentionPlan]:
    """The plans the last forward ("forward") and the last backward ("backward") followed."""
    return dict(_PLANS)


# The launchers as PyTorch custom operators: torch.compile (e.g. of FlashAttentionTriton.apply,
# as the course's leaderboard runs it) sees two opaque ops with known output shapes instead of
# tracing into the launchers and recompiling the kernels itself.
@torch.library.custom_op("cs336_systems::flash_triton_forward", mutates_args=())
def _forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_forward_triton(q, k, v, is_causal)


@_forward_op.register_fake
def _forward_fake(q, k, v, is_causal):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cs336_systems::flash_triton_backward", mutates_args=())
def _backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    do: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_backward_triton(q, k, v, o, do, lse, is_causal)


@_backward_op.register_fake
def _backward_fake(q, k, v, o, do, lse, is_causal):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels: ``FlashAttentionTriton.apply(Q, K, V, is_causal=False)``
    on (batch, n, d) or (batch, heads, n, d). Saves Q, K, V, O and L (fp32, Q's shape less d)."""

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        # the custom op under torch.compile; eager calls skip its dispatch (~80 us per call
        # measured on an H100, as much as the launch itself)
        if torch.compiler.is_compiling():
            O, L = _forward_op(Q, K, V, bool(is_causal))
        else:
            O, L = flash_forward_triton(Q, K, V, bool(is_causal))
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.is_causal = bool(is_causal)
        return O

    @staticmethod
    def backward(ctx, dO):
        Q, K, V, O, L = ctx.saved_tensors
        if torch.compiler.is_compiling():
            dQ, dK, dV = _backward_op(Q, K, V, O, dO, L, ctx.is_causal)
        else:
            dQ, dK, dV = flash_backward_triton(Q, K, V, O, dO, L, ctx.is_causal)
        return dQ, dK, dV, None


@torch.compiler.disable
def flash_attention(q, k, v, is_causal: bool = True) -> torch.Tensor:
    """Multi-head entry point, (batch, heads, n, d): the model's attention-function interface.

    Opaque to torch.compile (a graph break), so a compiled model calls the kernels as they are.
    """
    if q.dim() != 4:
        raise ValueError(
            f"flash_attention expects (batch, heads, n, d) tensors; got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    return FlashAttentionTriton.apply(q, k, v, is_causal)


def _register() -> None:
    from cs336_systems import model

    model.ATTENTION_FUNCTIONS["flash_triton"] = flash_attention


_register()
