"""Which kernel runs each pass of a FlashAttention call, with which tiles, and why: one plan.

`plan(dtype, head_dim, target)` answers for a call of `FlashAttentionTriton` (and of
`flash_forward_triton` / `flash_backward_triton`): the forward, D = rowsum(O * dO), the dK/dV
pass and the dQ pass each get a `Pass` naming its backend ("gluon": the Hopper kernels of
`kernels/hopper/`; "triton": the Triton-language kernels of `triton.forward` /
`triton.backward`), the kernel function, its tiles and the reason. The launchers follow
the plan; `flash_triton.chosen_configs()` and `last_plans()` report it.

The rules, in the order they are checked:
- Triton's interpreter (CPU tensors, no CUDA): the Triton-language kernels with the
  interpreter's small tiles (`triton.configs.INTERPRET_BLOCKS`); Gluon does not run there.
- A Gluon kernel runs only on Hopper (compute capability 9.x), for fp16/bf16, head dims
  16/32/64/128, tensors its TMA descriptors take (`hopper.configs.tensors_fit`), unless the
  call asks otherwise (`use_gluon=False`, `blocks`, `use_desc=False`, `fuse_dq=True`) or
  CS336_FLASH_GLUON=0 is set; and then only for the passes routed at that head dim
  (`hopper/configs.py`: where they measured faster on an H100) or all of them with
  `use_gluon=True`. Every other case names its reason in the plan.
- The Gluon dK/dV configuration at a head dim may compute dQ too (FUSE_DQ, d = 64): then there
  is no dQ pass. A routed Gluon dQ pass computes D itself; otherwise a small Triton kernel does.
- Triton-language passes are autotuned on the GPU among `triton.configs.tile_configs`,
  unless `blocks` fixes their tiles. Whether they address tiles through tensor descriptors
  (TMA) is decided per call from the tensors' alignment (`triton.launch.use_descriptors`)
  and reported in `chosen_configs()` as `use_desc`.

No fallback hides a failure: where the plan routes a pass to Gluon, the Gluon kernels are
imported and launched as they are, so a kernel that fails to import or to compile is an error.

    python -m cs336_systems.kernels.dispatch [--target sm_90|sm_80|interpreter]

prints the plan of every dtype and head dim on that target.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

from cs336_systems.kernels.hopper import configs as hopper_configs
from cs336_systems.kernels.triton import configs as tl_configs

GLUON_DTYPES = (torch.float16, torch.bfloat16)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# the D = rowsum(O * dO) kernel's query rows per program
PREPROCESS_BLOCK = {"cuda": 64, "interpreter": 16}


class Target(NamedTuple):
    """Where the kernels run: Triton's interpreter on CPU tensors, or a CUDA GPU of compute
    capability `capability`."""

    kind: str  # "interpreter" or "cuda"
    capability: tuple[int, int] | None = None

    @property
    def hopper(self) -> bool:
        return self.kind == "cuda" and self.capability is not None and self.capability[0] == 9

    def __str__(self) -> str:
        if self.kind == "interpreter":
            return "interpreter"
        major, minor = self.capability or (0, 0)
        return f"sm_{major}{minor}"

    @classmethod
    def parse(cls, text: str) -> Target:
        """'interpreter' or 'sm_90' (any sm_XY)."""
        if text == "interpreter":
            return INTERPRETER
        digits = text.removeprefix("sm_")
        return cls("cuda", (int(digits[:-1]), int(digits[-1])))


INTERPRETER = Target("interpreter")
HOPPER = Target("cuda", (9, 0))


@functools.cache
def _cuda_target(index: int) -> Target:
    return Target("cuda", tuple(torch.cuda.get_device_capability(index)))


def target_of(device) -> Target:
    """The target of tensors on `device`: a CUDA device's compute capability, or the
    interpreter for CPU tensors (the launchers refuse CPU tensors outside the interpreter)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


def default_target() -> Target:
    """This process's target: the interpreter when TRITON_INTERPRET is on or there is no CUDA,
    else the current GPU."""
    interpret = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
    if interpret or not torch.cuda.is_available():
        return INTERPRETER
    return target_of(torch.device("cuda"))


class Pass(NamedTuple):
    """One kernel launch of a plan. `name` is its key in `chosen_configs()` ("forward",
    "backward_dkdv", "backward_fused", "backward_dq", "preprocess"); `tiles` is a Gluon
    configuration (BLOCK_M, BLOCK_N, num_warps, STAGES[, switches]), Triton-language tiles
    ((BLOCK_Q, BLOCK_K) or a dict), or None: autotuned."""

    name: str
    backend: str  # "gluon" or "triton"
    kernel: str
    tiles: object
    reason: str

    @property
    def gluon(self) -> bool:
        return self.backend == "gluon"

    def config(self) -> dict | None:
        """A Gluon pass's tiles in the form of `chosen_configs()` (Triton-language passes
        report theirs at launch: the autotuner's choice is known only then)."""
        if not self.gluon:
            return None
        block_m, block_n, warps, stages = self.tiles[:4]
        switches = self.tiles[4] if len(self.tiles) > 4 else {}
        return {
            "BLOCK_Q": block_m,
            "BLOCK_K": block_n,
            "num_warps": warps,
            "num_stages": stages,
            "use_desc": True,
            "autotuned": False,
            "kernel": "gluon",
            "warp_specialized": bool(switches.get("WS")),
            # the config's group of heads; the launcher applies it on long sequences only
            "heads_together": int(switches.get("HEADS_TOGETHER", 0)),
            "reason": self.reason,
        }

    def describe(self) -> str:
        tiles = "" if self.tiles is None else f" {self.tiles}"
        return f"{self.name}: {self.backend} {self.kernel}{tiles} -- {self.reason}"


class AttentionPlan(NamedTuple):
    """What runs for one (dtype, head dim, target) and call options: the forward, D, the dK/dV
    pass and the dQ pass (None where the dK/dV pass computes dQ too)."""

    target: Target
    dtype: torch.dtype
    head_dim: int
    forward: Pass
    delta: Pass
    dkdv: Pass
    dq: Pass | None

    @property
    def backward(self) -> tuple[Pass, ...]:
        """The backward's passes in launch order (a Gluon dQ pass computes D, so it comes
        first)."""
        if self.dq is not None and self.dq.gluon:
            return (self.dq, self.dkdv)
        return tuple(p for p in (self.delta, self.dkdv, self.dq) if p is not None)

    @property
    def fused_dq(self) -> bool:
        """The dK/dV pass computes dQ too (Gluon FUSE_DQ, or the Triton-language fused pass)."""
        return self.dq is None

    @property
    def gluon_backward(self) -> bool:
        """Both backward passes are Gluon kernels: they read dO through TMA descriptors, which
        take the stride-0 gradient of o.sum() as it is."""
        return self.dkdv.gluon and (self.dq is None or self.dq.gluon)

    @property
    def reason(self) -> str:
        passes = [self.forward, *self.backward]
        return "; ".join(f"{p.name} {p.backend}: {p.reason}" for p in passes)

    def describe(self) -> str:
        head = f"{self.target}, {DTYPE_NAMES.get(self.dtype, self.dtype)}, d = {self.head_dim}"
        return "\n".join([head, *(f"  {p.describe()}" for p in (self.forward, *self.backward))])


def _gluon_kernel(name: str, config) -> str:
    ws = len(config) > 4 and config[4].get("WS")
    return {
        "forward": "_attn_fwd_ws_kernel" if ws else "_attn_fwd_kernel",
        "backward_dkdv": "_attn_bwd_dkdv_ws_kernel" if ws else "_attn_bwd_dkdv_kernel",
        "backward_dq": "_attn_bwd_dq_ws_kernel",
    }[name]


TRITON_KERNELS = {
    "forward": "_attn_fwd",
    "backward_dkdv": "_attn_bwd_dkdv",
    "backward_fused": "_attn_bwd_dkdv",
    "backward_dq": "_attn_bwd_dq",
    "preprocess": "_attn_bwd_preprocess",
}


def _gluon_unavailable(target, dtype, head_dim, use_gluon, blocks, use_desc, gluon_on) -> str:
    """Why no pass of this call can be a Gluon kernel ('' where some can)."""
    if target.kind == "interpreter":
        return "Triton's interpreter (no GPU): Gluon kernels do not run in it"
    if use_gluon is False:
        return "use_gluon=False"
    if not target.hopper:
        return f"{target}: the Gluon kernels are for Hopper (sm_90)"
    if dtype not in GLUON_DTYPES:
        return f"{DTYPE_NAMES.get(dtype, dtype)}: the Gluon kernels take fp16 and bf16"
    if head_dim not in hopper_configs.HEAD_DIMS:
        return f"d = {head_dim}: the Gluon kernels take d in {hopper_configs.HEAD_DIMS}"
    if not gluon_on:
        return "CS336_FLASH_GLUON=0"
    if blocks is not None:
        return "tiles given (blocks=...)"
    if use_desc is False:
        return "use_desc=False"
    return ""


def _triton_pass(name: str, target: Target, blocks, reason: str) -> Pass:
    per_pass = isinstance(blocks, dict) and any(key in blocks for key in tl_configs.KERNELS)
    given = blocks.get(name) if per_pass else blocks
    if given is not None:
        tiles, how = given, "tiles given"
    elif target.kind == "interpreter":
        tiles, how = tl_configs.INTERPRET_BLOCKS[name], "the interpreter's tiles"
    else:
        tiles, how = None, "autotuned"
    return Pass(name, "triton", TRITON_KERNELS[name], tiles, f"{reason}; {how}")


def _gluon_pass(name: str, head_dim: int, use_gluon) -> Pass:
    config = hopper_configs.config_for(name, head_dim)
    if hopper_configs.routed(name, head_dim):
        reason = f"routed at d = {head_dim}, where it measured faster on an H100"
    else:
        reason = f"use_gluon=True (not routed at d = {head_dim}: default tiles)"
    return Pass(name, "gluon", _gluon_kernel(name, config), config, reason)


def plan(
    dtype: torch.dtype,
    head_dim: int,
    target: Target | torch.device | str | None = None,
    *,
    use_gluon: bool | None = None,
    blocks=None,
    use_desc: bool | None = None,
    fuse_dq: bool = False,
    tensors: tuple = (),
    o: torch.Tensor | None = None,
) -> AttentionPlan:
    """The plan of a call on `target` (a `Target`, a device, or None: this process's). The
    options are those of `flash_forward_triton` / `flash_backward_triton`; `tensors` are the
    call's (batch, heads, n, d) tensors and `o` the forward's output (read by the Gluon dQ
    pass), checked against what the Gluon kernels' TMA descriptors take (none given: a plan in
    the abstract, as if they fit). ValueError where `use_gluon=True` cannot be honoured.

    Plans are kept per (arguments, routing-table entries): every call of the autograd Function
    asks, and a plan costs more Python than the launch around it. The tables' entries are
    read by identity, so replace an entry to change it (as tests and scripts do), never edit
    one in place."""
    if target is None:
        target = default_target()
    elif not isinstance(target, Target):
        target = target_of(target)
    # the tensors are looked at only where a Gluon kernel could run at all
    maybe = target.hopper and dtype in GLUON_DTYPES and head_dim in hopper_configs.HEAD_DIMS
    fits = not (maybe and tensors) or hopper_configs.tensors_fit(*tensors)
    o_fits = o is None or not maybe or hopper_configs.tensors_fit(*tensors[:1], o)
    gluon_on = not maybe or os.environ.get("CS336_FLASH_GLUON", "1") != "0"
    args = (dtype, head_dim, target, use_gluon, blocks, use_desc, bool(fuse_dq))
    entries = table_entries(head_dim)
    key = (*args, fits, o_fits, gluon_on, *map(id, entries))
    try:
        return _CACHE[key][0]
    except KeyError:
        pass
    except TypeError:  # unhashable options (blocks as a dict): plan without keeping it
        return _plan(*args, fits, o_fits, gluon_on)
    made = _plan(*args, fits, o_fits, gluon_on)
    _CACHE[key] = (made, entries)  # (the entries stay alive, so their ids stay theirs)
    return made


_CACHE: dict[tuple, tuple[AttentionPlan, tuple]] = {}


def table_entries(head_dim: int) -> tuple:
    """The routing-table entries a plan at this head dim reads (the kept programs of
    `flash_triton` key on them too)."""
    return (
        hopper_configs.FORWARD_CONFIGS.get(head_dim),
        hopper_configs.DKDV_CONFIGS.get(head_dim),
        hopper_configs.DQ_CONFIGS.get(head_dim),
        *hopper_configs.DEFAULT_CONFIGS.values(),
        *tl_configs.INTERPRET_BLOCKS.values(),
    )


def _plan(dtype, head_dim, target, use_gluon, blocks, use_desc, fuse_dq, fits, o_fits, gluon_on):
    why_not = _gluon_unavailable(target, dtype, head_dim, use_gluon, blocks, use_desc, gluon_on)
    if not why_not and not fits:
        why_not = "tensors not TMA-addressable (unit last stride, 16-byte aligned strides)"
    if not why_not and fuse_dq and use_gluon:
        why_not = "fuse_dq=True (the Triton-language fused pass)"
    if why_not and use_gluon:
        raise ValueError(
            f"use_gluon=True: the Gluon kernels need a Hopper GPU, fp16/bf16, head dim in "
            f"16/32/64/128 and 16-byte aligned strides; here {why_not}"
        )

    def routed(name: str) -> bool:
        return bool(use_gluon) or hopper_configs.routed(name, head_dim)

    def not_routed(name: str) -> str:
        return f"the Gluon {name} pass is not routed at d = {head_dim}"

    if why_not:
        forward = _triton_pass("forward", target, blocks, why_not)
    elif routed("forward"):
        forward = _gluon_pass("forward", head_dim, use_gluon)
    else:
        forward = _triton_pass("forward", target, blocks, not_routed("forward"))

    why_not_bwd = why_not or ("fuse_dq=True (the Triton-language fused pass)" if fuse_dq else "")
    dq: Pass | None
    if fuse_dq:
        dkdv = _triton_pass("backward_fused", target, blocks, why_not or "fuse_dq=True")
        dq = None
    elif why_not_bwd:
        dkdv = _triton_pass("backward_dkdv", target, blocks, why_not_bwd)
        dq = _triton_pass("backward_dq", target, blocks, why_not_bwd)
    else:
        if routed("backward_dkdv"):
            dkdv = _gluon_pass("backward_dkdv", head_dim, use_gluon)
        else:
            dkdv = _triton_pass("backward_dkdv", target, blocks, not_routed("dK/dV"))
        if dkdv.gluon and hopper_configs.fuses_dq(head_dim, dkdv.tiles):
            dq = None  # FUSE_DQ: the dK/dV pass adds dQ into an fp32 accumulator
        elif not dkdv.gluon or not routed("backward_dq"):
            dq = _triton_pass("backward_dq", target, blocks, not_routed("dQ"))
        elif not o_fits:
            dq = _triton_pass("backward_dq", target, blocks, "O not TMA-addressable")
        else:
            dq = _gluon_pass("backward_dq", head_dim, use_gluon)
    if dq is not None and dq.gluon:
        delta = Pass("preprocess", "gluon", dq.kernel, None, "the Gluon dQ pass computes D")
    else:
        block = {"BLOCK_Q": PREPROCESS_BLOCK[target.kind]}
        delta = Pass("preprocess", "triton", TRITON_KERNELS["preprocess"], block, "D kernel")
    return AttentionPlan(target, dtype, head_dim, forward, delta, dkdv, dq)


def routing_table(
    target: Target,
    dtypes=(torch.float16, torch.bfloat16, torch.float32),
    head_dims=(16, 32, 40, 64, 128),
) -> list[dict]:
    """One row per (dtype, head dim, pass) of the default plans on `target`: what a report or a
    reader needs to see where each call goes."""
    rows = []
    for dtype in dtypes:
        for d in head_dims:
            p = plan(dtype, d, target)
            for one in (p.forward, *p.backward):
                rows.append(
                    {
                        "target": str(target),
                        "dtype": DTYPE_NAMES[dtype],
                        "head_dim": d,
                        "pass": one.name,
                        "backend": one.backend,
                        "kernel": one.kernel,
                        "tiles": "autotuned" if one.tiles is None else str(one.tiles),
                        "reason": one.reason,
                    }
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", default="sm_90", help="interpreter, sm_90, sm_80, ...")
    args = ap.parse_args(argv)
    target = Target.parse(args.target)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for d in (16, 32, 40, 64, 128):
            print(plan(dtype, d, target).describe())


if __name__ == "__main__":
    main()
