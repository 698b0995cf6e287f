"""What the Triton-language FlashAttention-2 kernels share: the interpreter switch, constants, and
the tile helpers every kernel uses (masked loads and stores, tensor descriptors, causal ranges).

Conventions of all our kernels: (batch, heads, n, d) tensors addressed through their strides
(transposed or sliced views need no copy); any lengths (masked loads), n_queries may differ from
n_keys; d padded to a power of two (>= 16) with masks, so 1 <= d <= 128; causal masking is a
compile-time flag, top-left aligned (``query index >= key index``, the convention of the course's
reference and of torch SDPA's ``is_causal``); L, the logsumexp saved for the backward, is fp32 in
natural-log units.

Without CUDA, importing this module turns on Triton's interpreter (unless TRITON_INTERPRET is
set) so the same kernels run on CPU tensors: every kernel module imports this one before it
defines a kernel (the jit decorator picks interpreter or compiler at definition time).
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # the jit decorators of the kernel modules pick interpreter or compiler at definition time
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")
MAX_HEAD_DIM = 128
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634
# runtime sizes are not specialised on (divisible by 16, == 1): fewer compiled variants
NOT_SPECIALIZED = ["n_heads", "n_q", "n_k", "N_Q_BUCKET", "N_K_BUCKET"]


def _fix_interpreter_scalar_index() -> None:
    """Triton's interpreter holds scalars as 1-element arrays and turns them into loop bounds with
    ``int(array)``, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted"), so
    any ``range(0, n)`` over a runtime bound fails. Convert through ``.item()`` instead."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_scalar_index_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._scalar_index_fixed = True
    interpreter._patch_lang_tensor = patched


def _add_interpreter_descriptor_reduce() -> None:
    """Triton 3.6's interpreter has no bulk tensor reduction (``desc.atomic_add``): emulate the
    add as load + add + store over the descriptor's in-range elements (the interpreter runs
    programs one after another, so this is atomic)."""
    try:
        from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    except ImportError:  # pragma: no cover
        return
    if hasattr(InterpreterBuilder, "create_descriptor_reduce"):
        return

    def create_descriptor_reduce(self, kind, desc, value, indices):
        if "ADD" not in str(kind).upper():
            raise NotImplementedError(f"descriptor reduction {kind} in the interpreter")
        ptrs, mask = desc.materialize_pointers(indices)
        zero = TensorHandle(np.zeros_like(value.data), value.dtype.scalar)
        old = self.create_masked_load(ptrs, mask, zero, None, None, False)
        total = TensorHandle(old.data + value.data, value.dtype.scalar)
        return self.create_masked_store(ptrs, total, mask, None, None)

    InterpreterBuilder.create_descriptor_reduce = create_descriptor_reduce


if INTERPRET:
    import numpy as np

    _fix_interpreter_scalar_index()
    _add_interpreter_descriptor_reduce()


@triton.jit
def load_rows(
    ptrs,
    rows,
    n_rows,
    offs_d,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
):
    """Load a (rows x D_PAD) tile; rows >= n_rows and padded features read as zero."""
    if CHECK_ROWS:
        mask = rows[:, None] < n_rows
        if D_PAD != HEAD_DIM:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        if D_PAD != HEAD_DIM:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def tile_source(
    base, n_rows, stride_n, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_DESC: tl.constexpr
):
    """What tiles of one (n_rows x HEAD_DIM) head are read from (and written to): a tensor
    descriptor (Hopper's bulk tensor copies; out-of-range rows read as zero, stores clipped) or
    the base pointer itself."""
    if USE_DESC:
        src = tl.make_tensor_descriptor(
            base, shape=[n_rows, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK, HEAD_DIM]
        )
    else:
        src = base
    return src


@triton.jit
def load_tile(
    src,
    row0,
    rows,
    n_rows,
    stride_n,
    stride_d,
    offs_d,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
    USE_DESC: tl.constexpr,
):
    """The tile of rows `rows` (= row0 + arange) from a `tile_source`."""
    if USE_DESC:
        x = src.load([row0, 0])
    else:
        x = load_rows(
            src + rows[:, None] * stride_n + offs_d[None, :] * stride_d,
            rows,
            n_rows,
            offs_d,
            HEAD_DIM,
            D_PAD,
            CHECK_ROWS,
        )
    return x


@triton.jit
def store_tile(
    dst,
    row0,
    x,
    rows,
    n_rows,
    stride_n,
    stride_d,
    offs_d,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    USE_DESC: tl.constexpr,
):
    if USE_DESC:
        dst.store([row0, 0], x)
    else:
        mask = rows[:, None] < n_rows
        if D_PAD != HEAD_DIM:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        tl.store(dst + rows[:, None] * stride_n + offs_d[None, :] * stride_d, x, mask=mask)


@triton.jit
def tile_index(TILE_AXIS: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """This program's tile along the grid's tile axis. With causal masking the work per tile
    grows with the query index: heaviest tiles are launched first (longest-processing-time
    order), so the last wave is made of the short ones."""
    if HEAVY_LAST:
        return tl.num_programs(TILE_AXIS) - 1 - tl.program_id(TILE_AXIS)
    return tl.program_id(TILE_AXIS)


@triton.jit
def key_range(q0, n_k, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Key tiles of the query tile starting at q0: [0, lo_masked) need no masks (causal: keys
    before q0, visible to every row), [lo_masked, hi) do (the diagonal, the ragged end); keys
    from hi on are visible to no row of the tile."""
    if IS_CAUSAL:
        hi = tl.minimum(n_k, q0 + BLOCK_Q)
        lo_masked = (tl.minimum(q0, n_k) // BLOCK_K) * BLOCK_K
    else:
        hi = n_k
        lo_masked = (n_k // BLOCK_K) * BLOCK_K
    return lo_masked, hi
