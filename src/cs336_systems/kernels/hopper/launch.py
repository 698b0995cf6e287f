"""Host side of the Hopper kernels: TMA descriptors, compile-time constants and grids of each
launch, and the calls `forward`, `backward_dkdv`, `backward_dq` on (batch, heads, n, d) tensors
that `supported()` accepts, with their `*_into` forms (outputs given, the launch returned) that
the cached programs of `kernels.flash_triton` call."""

from __future__ import annotations

import functools
import math

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from cs336_systems.kernels.bound_launch import Launched
from cs336_systems.kernels.hopper.backward_dkdv import _attn_bwd_dkdv_kernel
from cs336_systems.kernels.hopper.backward_dkdv_ws import _attn_bwd_dkdv_ws_kernel
from cs336_systems.kernels.hopper.backward_dq import _attn_bwd_dq_ws_kernel
from cs336_systems.kernels.hopper.configs import HEAD_DIMS, config_for, fuses_dq, tensors_fit
from cs336_systems.kernels.hopper.forward import _attn_fwd_kernel, _attn_fwd_ws_kernel

LOG2E = 1.4426950408889634
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


@functools.cache
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def supported(*tensors: torch.Tensor) -> bool:
    """Whether these (batch, heads, n, d) tensors can go through the Hopper kernels: on a Hopper
    GPU, fp16/bf16, a head dim in HEAD_DIMS, and layouts the TMA descriptors take."""
    x = tensors[0]
    if x.device.type != "cuda" or x.dtype not in GL_DTYPES or x.shape[-1] not in HEAD_DIMS:
        return False
    if not _is_hopper(x.device.index if x.device.index is not None else 0):
        return False
    return tensors_fit(*tensors)


def _descriptor(
    x: torch.Tensor, block_rows: int, block_cols: int | None = None
) -> TensorDescriptor:
    """A TMA descriptor over (batch, heads, n, d) with (1, 1, block_rows, block_cols) tiles
    (block_cols: d unless given): rows past n read as zeros and are not written, per head."""
    block = [1, 1, block_rows, block_cols or x.shape[-1]]
    dtype = gl.float32 if x.dtype == torch.float32 else GL_DTYPES[x.dtype]
    layout = gl.NVMMASharedLayout.get_default_for(block, dtype)
    return TensorDescriptor(x, list(x.shape), list(x.stride()), block, layout)


def _constants(head_dim, config, is_causal) -> dict:
    """Compile-time constants and launch options of `config`: (BLOCK_M, BLOCK_N, num_warps,
    STAGES), optionally followed by a dict of other switches (WS: the warp-specialized forward;
    A_IN_REGS: the dK/dV pass's K and V in registers)."""
    block_m, block_n, warps, stages = config[:4]
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        IS_CAUSAL=bool(is_causal),
        STAGES=stages,
        num_warps=warps,
        **(config[4] if len(config) > 4 else {}),
    )


# HEADS_TOGETHER (hopper/common.py: program_tile) applies only where each head has at least this
# many programs: at n = 16384 (86-128 a head) grouping two heads took the d = 64 and d = 128
# forward+backward from 0.96x and 1.04x cuDNN to 0.94x and 1.005x, with the dK/dV pass's DRAM
# traffic 5.4x lower at d = 128 (one H100, round 11 of the flash notes); at n = 4096 (22-32 a
# head) the grid's own order, every head's heaviest programs first, kept d = 128 at 0.92x
# against 1.00x grouped, the groups' heavy programs starting late
TOGETHER_MIN_TILES = 64


def _launch_order(constants: dict, tiles: int) -> dict:
    """`constants` with their HEADS_TOGETHER where a head has `tiles` >= TOGETHER_MIN_TILES
    programs, and 0 (the grid's order) otherwise."""
    if constants.get("HEADS_TOGETHER") and tiles < TOGETHER_MIN_TILES:
        return {**constants, "HEADS_TOGETHER": 0}
    return constants


def _consumer_regs(block_m: int) -> int:
    """Registers per thread of each of the block_m / 64 consumer warpgroups of a
    warp-specialized kernel: what two or three warpgroups and the producer warp can share of an
    SM's 64K."""
    return 240 if block_m == 128 else 160


def _forward_call(q, k, v, o, lse, is_causal, config=None):
    """(kernel, grid, arguments, compile-time constants) of one forward launch."""
    b, h, n_q, d = q.shape
    config = config or config_for("forward", d)
    block_m, block_n = config[:2]
    constants = _constants(d, config, is_causal)
    ws = constants.pop("WS", False)
    if ws:  # block_m / 64 consumer warpgroups of 64 rows each, and a producer warp
        constants = {"CONSUMER_REGS": _consumer_regs(block_m), **constants, "num_warps": 4}
    q_rows = 64 if ws else block_m
    args = dict(
        q_desc=_descriptor(q, q_rows),
        k_desc=_descriptor(k, block_n),
        v_desc=_descriptor(v, block_n),
        o_desc=_descriptor(o, q_rows),
        L=lse,
        n_heads=h,
        n_q=n_q,
        n_k=k.shape[2],
        qk_scale=LOG2E / math.sqrt(d),
    )
    grid = (b * h, triton.cdiv(n_q, block_m))
    constants = _launch_order(constants, grid[1])
    return (_attn_fwd_ws_kernel if ws else _attn_fwd_kernel), grid, args, constants


def _dkdv_call(q, k, v, do, lse, delta, dk, dv, is_causal, config=None, dq=None):
    """(kernel, grid, arguments, compile-time constants) of one dK/dV launch; `dq` is the fp32
    tensor the FUSE_DQ configs add dQ into (unused otherwise)."""
    b, h, n_q, d = q.shape
    config = config or config_for("backward_dkdv", d)
    block_m, block_n = config[:2]
    rows = dict(q_desc=(q, block_m), k_desc=(k, block_n), v_desc=(v, block_n))
    rows.update(do_desc=(do, block_m), dk_desc=(dk, block_n), dv_desc=(dv, block_n))
    rows.update(dq_desc=(dq if dq is not None else dk, block_m))
    constants = _constants(d, config, is_causal)
    ws = constants.pop("WS", False)
    if ws:  # two consumer warpgroups of block_n / 2 keys each, and a producer warp
        # (FUSE_DQ: and a dQ warpgroup, for which the consumers give up registers)
        regs = 216 if constants.get("FUSE_DQ") and not constants.get("SERIAL") else 240
        constants = {
            "CONSUMER_REGS": regs,
            "DS_BUFS": 3,
            "DQ_REGS": 72,
            **constants,
            "num_warps": 4,
        }
        for name in ("k_desc", "v_desc", "dk_desc", "dv_desc"):
            rows[name] = (rows[name][0], block_n // 2)
    args = {name: _descriptor(x, r) for name, (x, r) in rows.items()}
    if ws and constants.get("FUSE_DQ") and constants.get("SERIAL"):
        # each consumer adds its half of dQ's columns
        args["dq_desc"] = _descriptor(rows["dq_desc"][0], block_m, d // 2)
    args.update(L=lse, Delta=delta, n_heads=h, n_q=n_q, n_k=k.shape[2])
    args.update(qk_scale=LOG2E / math.sqrt(d), sm_scale=1.0 / math.sqrt(d))
    grid = (b * h, triton.cdiv(k.shape[2], block_n))
    constants = _launch_order(constants, grid[1])
    return (_attn_bwd_dkdv_ws_kernel if ws else _attn_bwd_dkdv_kernel), grid, args, constants


def _dq_call(q, k, v, do, lse, delta, dq, is_causal, config=None, o=None):
    """(kernel, grid, arguments, compile-time constants) of one dQ launch; with `o`, the pass
    computes D from O and dO and writes it into `delta`."""
    b, h, n_q, d = q.shape
    config = config or config_for("backward_dq", d)
    block_m, block_n = config[:2]
    constants = _constants(d, config, is_causal)
    if not constants.pop("WS", False):
        raise ValueError(f"the Gluon dQ pass is warp-specialized: {config} lacks {{'WS': True}}")
    # block_m / 64 consumer warpgroups of 64 rows each, and a producer warp
    q_rows = 64
    rows = dict(q_desc=(q, q_rows), k_desc=(k, block_n), v_desc=(v, block_n))
    rows.update(do_desc=(do, q_rows), o_desc=(do if o is None else o, q_rows))
    rows.update(dq_desc=(dq, q_rows))
    args = {name: _descriptor(x, r) for name, (x, r) in rows.items()}
    args.update(L=lse, Delta=delta, n_heads=h, n_q=n_q, n_k=k.shape[2])
    args.update(qk_scale=LOG2E / math.sqrt(d), sm_scale=1.0 / math.sqrt(d))
    grid = (b * h, triton.cdiv(n_q, block_m))
    if o is not None:
        constants["DELTA"] = True
    constants = {"CONSUMER_REGS": _consumer_regs(block_m), **constants, "num_warps": 4}
    return _attn_bwd_dq_ws_kernel, grid, args, _launch_order(constants, grid[1])


def _launch(call) -> Launched:
    kernel, grid, args, constants = call
    compiled = kernel[grid](**args, **constants)
    return Launched(kernel, compiled, grid, (), {**args, **constants})


def forward_into(q, k, v, o, lse, is_causal: bool, config=None) -> Launched:
    """The forward into `o` and `lse` (fp32, (batch, heads, n_q)); returns the launch (what a
    cached program binds, `kernels.bound_launch`)."""
    return _launch(_forward_call(q, k, v, o, lse, is_causal, config))


def backward_dkdv_into(q, k, v, do, lse, delta, dk, dv, is_causal: bool, config=None, acc=None):
    """dK and dV into `dk`, `dv`; where the config fuses dQ, dQ added into `acc` (fp32, Q's
    shape, contiguous, zeroed by the caller). Returns the launch."""
    if fuses_dq(q.shape[-1], config) and acc is None:
        raise ValueError("this dK/dV configuration computes dQ: pass its fp32 accumulator `acc`")
    return _launch(_dkdv_call(q, k, v, do, lse, delta, dk, dv, is_causal, config, dq=acc))


def backward_dq_into(q, k, v, do, lse, delta, dq, is_causal: bool, config=None, o=None):
    """dQ into `dq` (and with `o`, D into `delta`). Returns the launch."""
    return _launch(_dq_call(q, k, v, do, lse, delta, dq, is_causal, config, o))


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, config=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L (fp32, (batch, heads, n_q)) for 4-D inputs that `supported()` accepts.
    `config` = (BLOCK_M, BLOCK_N, num_warps, STAGES) overrides FORWARD_CONFIGS."""
    b, h, n_q, d = q.shape
    o = torch.empty((b, h, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=q.device)
    forward_into(q, k, v, o, lse, is_causal, config)
    return o, lse


def backward_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal: bool, config=None, dq=None) -> None:
    """dK and dV (written into `dk`, `dv`) for 4-D inputs that `supported()` accepts; `lse` and
    `delta` are (batch, heads, n_q) fp32, contiguous. `config` = (BLOCK_M, BLOCK_N, num_warps,
    STAGES[, switches]) overrides DKDV_CONFIGS. Where the config fuses dQ (`fuses_dq`), dQ is
    written into `dq` too (through an fp32 accumulator of Q's shape)."""
    d = q.shape[-1]
    acc = None
    if fuses_dq(d, config):
        if dq is None:
            raise ValueError("this dK/dV configuration computes dQ: pass `dq`")
        acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    backward_dkdv_into(q, k, v, do, lse, delta, dk, dv, is_causal, config, acc=acc)
    if acc is not None:
        dq.copy_(acc)


def backward_dq(q, k, v, do, lse, delta, dq, is_causal: bool, config=None, o=None) -> None:
    """dQ (written into `dq`) for 4-D inputs that `supported()` accepts; `lse` and `delta` as
    for `backward_dkdv`. `config` = (BLOCK_M, BLOCK_N, num_warps, STAGES) overrides DQ_CONFIGS.
    With `o` (the forward's output), D = rowsum(O * dO) is computed here and written into
    `delta` (which then need not hold anything)."""
    backward_dq_into(q, k, v, do, lse, delta, dq, is_causal, config, o)
