"""AdamW on fp32 master weights for bf16 working weights, one fused Triton pass per tensor.

Megatron's "bf16 params + fp32 main params": the Linear layers compute with bf16 leaf weights
(no autocast cast each forward, a bf16 .grad), and the optimizer keeps the fp32 master copy with
AdamW's two fp32 moments. ``adamw_update`` reads the fp32 master p, the grad (bf16 or fp32),
fp32 m and v, and writes p, m, v and, when given, the bf16 working copy cast(p_new): 4 + 2 + 8
bytes read, 4 + 8 + 2 written per parameter (28 B) where the unfused route (autocast's weight
cast each forward, the bf16 grad cast to an fp32 .grad, fused AdamW on fp32 p/g/m/v) moves
about 40.

torch.optim.AdamW's update exactly (amsgrad off, not maximize), step t counted per tensor:

    p *= 1 - lr wd                       (decoupled weight decay)
    m += (1 - beta1) (g - m)             (torch's lerp)
    v  = beta2 v + (1 - beta2) g g
    p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

in fp32 with IEEE-rounded sqrt and division (``tl.sqrt_rn``, ``tl.div_rn``), as torch's CPU
foreach path rounds them. CUDA tensors (or any tensor under ``TRITON_INTERPRET=1``) take the
Triton kernel; a CPU tensor without the interpreter takes the same formula in torch ops.

``MasterAdamW`` owns the masters of the bf16 working parameters and hands every other parameter
(embedding, RMSNorm gains: fp32, autocast does not cast them) to torch.optim.AdamW (fused on
CUDA, foreach on the CPU) with the same hyperparameters.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def _adamw_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    w_ptr,
    n,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    decay,
    step_size,
    bc2_sqrt,
    WRITE_W: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = p * decay
    m = m + one_minus_beta1 * (g - m)
    v = v * beta2 + (one_minus_beta2 * g) * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = p - step_size * tl.div_rn(m, denom)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    if WRITE_W:  # bf16 bits of p, rounded to nearest even (the interpreter's cast truncates)
        bits = p.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        tl.store(w_ptr + offs, (bits >> 16).to(tl.int16), mask=mask)


def uses_triton(t: torch.Tensor) -> bool:
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def coefficients(
    step: int, lr: float, beta1: float, beta2: float, weight_decay: float
) -> tuple[float, float, float]:
    """(decay, step_size, sqrt of bias correction 2) of AdamW's `step`-th update (from 1)."""
    return 1.0 - lr * weight_decay, lr / (1.0 - beta1**step), math.sqrt(1.0 - beta2**step)


def _check(p, g, m, v, out) -> None:
    for name, t in (("p", p), ("m", m), ("v", v)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous fp32 tensor, got {t.dtype}")
        if t.shape != p.shape or t.device != p.device:
            raise ValueError(f"{name} {tuple(t.shape)} on {t.device} differs from p's")
    for name, t in (("grad", g), ("out", out)):
        if t is None:
            continue
        if not t.is_floating_point() or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous float tensor, got {t.dtype}")
        if name == "out" and t.dtype != torch.bfloat16:
            raise ValueError(f"out must be bf16, got {t.dtype}")
        if t.shape != p.shape or t.device != p.device:
            raise ValueError(f"{name} {tuple(t.shape)} on {t.device} differs from p's")


def adamw_update(
    p: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    out: torch.Tensor | None = None,
    check: bool = True,
) -> None:
    """One AdamW update of fp32 `p`, `m`, `v` in place from `grad` (any float dtype), step
    `step` (1 for the first); `out` (optional, bf16) receives cast(p_new), rounded to nearest
    even as ``.to(torch.bfloat16)`` (NaN payloads aside)."""
    if check:
        _check(p, grad, m, v, out)
    decay, step_size, bc2_sqrt = coefficients(step, lr, beta1, beta2, weight_decay)
    if not uses_triton(p):
        _torch_update(p, grad, m, v, beta1, beta2, eps, decay, step_size, bc2_sqrt, out)
        return
    grid = (triton.cdiv(p.numel(), BLOCK),)
    bits = None if out is None else out.view(torch.int16)
    _launch(p, grad, m, v, bits, grid, beta1, beta2, eps, decay, step_size, bc2_sqrt)


def _launch(p, grad, m, v, bits, grid, beta1, beta2, eps, decay, step_size, bc2_sqrt) -> None:
    """The kernel on one tensor; `bits`: the bf16 output viewed as int16, or None."""
    _adamw_kernel[grid](
        p,
        grad,
        m,
        v,
        p if bits is None else bits,
        p.numel(),
        beta1,
        beta2,
        1.0 - beta1,
        1.0 - beta2,
        eps,
        decay,
        step_size,
        bc2_sqrt,
        WRITE_W=bits is not None,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )


def _torch_update(p, grad, m, v, beta1, beta2, eps, decay, step_size, bc2_sqrt, out) -> None:
    g = grad.float()
    p.mul_(decay)
    m.lerp_(g, 1.0 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    p.addcdiv_(m, v.sqrt().div_(bc2_sqrt).add_(eps), value=-step_size)
    if out is not None:
        out.copy_(p)


class MasterAdamW(torch.optim.Optimizer):
    """AdamW whose `working` parameters (bf16 leaves the model computes with) are updated
    through fp32 masters: ``working`` is a list of (working parameter, fp32 master of the same
    shape); `rest` the parameters updated in their own dtype by torch.optim.AdamW.

    ``zero_grad``, ``step``, ``state_dict``/``load_state_dict``, ``master(p)``; the
    hyperparameters are read from ``param_groups[0]`` at each step (a scheduler may set lr)."""

    def __init__(
        self,
        working: list[tuple[torch.nn.Parameter, torch.Tensor]],
        rest: list[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ):
        if not working:
            raise ValueError("MasterAdamW needs at least one working parameter")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__([w for w, _ in working], defaults)
        for w, master in working:
            if master.dtype != torch.float32 or master.shape != w.shape:
                raise ValueError(f"master {master.dtype} {tuple(master.shape)} for {w.dtype}")
            master = master.detach().contiguous()
            self.state[w] = {
                "step": 0,
                "master": master,
                "exp_avg": torch.zeros_like(master),
                "exp_avg_sq": torch.zeros_like(master),
            }
        # launch order and per-tensor launch arguments, computed once
        self._slots = [(w, self.state[w]) for w, _ in working]
        self._launch_args = [
            (w.data.view(torch.int16), (triton.cdiv(w.numel(), BLOCK),), uses_triton(w))
            for w, _ in working
        ]
        self.rest = None
        if rest:
            cuda = rest[0].is_cuda
            self.rest = torch.optim.AdamW(
                rest, **defaults, **({"fused": True} if cuda else {"foreach": True})
            )

    def master(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master of a working parameter; any other parameter itself."""
        state = self.state.get(p)
        return state["master"] if state and "master" in state else p.detach()

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        if self.rest is not None:
            self.rest.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MasterAdamW.step takes no closure")
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, wd = (
            group["lr"],
            group["betas"],
            group["eps"],
            group["weight_decay"],
        )
        for (w, st), (bits, grid, on_triton) in zip(self._slots, self._launch_args, strict=True):
            g = w.grad
            if g is None:
                continue
            st["step"] += 1
            decay, step_size, bc2_sqrt = coefficients(st["step"], lr, beta1, beta2, wd)
            g = g if g.is_contiguous() else g.contiguous()
            args = (st["master"], g, st["exp_avg"], st["exp_avg_sq"])
            if on_triton:
                _launch(*args, bits, grid, beta1, beta2, eps, decay, step_size, bc2_sqrt)
            else:
                _torch_update(*args, beta1, beta2, eps, decay, step_size, bc2_sqrt, w.data)
        if self.rest is not None:
            for g in self.rest.param_groups:
                g.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
            # the inner step without the optimizer hooks: this step is the one that fires them
            inner = getattr(type(self.rest).step, "__wrapped__", type(self.rest).step)
            inner(self.rest)
        return None

    def state_dict(self) -> dict:
        keys = ("step", "master", "exp_avg", "exp_avg_sq")
        return {
            "param_groups": [
                {k: v for k, v in g.items() if k != "params"} for g in self.param_groups
            ],
            "working": [{k: st[k] for k in keys} for _, st in self._slots],
            "rest": None if self.rest is None else self.rest.state_dict(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Masters and moments copied in place (fp32 kept), working copies re-cast from them."""
        saved = state_dict["working"]
        if len(saved) != len(self._slots):
            raise ValueError(f"{len(saved)} saved working tensors for {len(self._slots)}")
        self.param_groups[0].update(state_dict["param_groups"][0])
        with torch.no_grad():
            for (w, st), s in zip(self._slots, saved, strict=True):
                st["step"] = int(s["step"])
                for k in ("master", "exp_avg", "exp_avg_sq"):
                    st[k].copy_(s[k])
                w.copy_(st["master"])
        if self.rest is not None:
            self.rest.load_state_dict(state_dict["rest"])
