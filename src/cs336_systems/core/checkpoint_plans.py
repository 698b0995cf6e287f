"""Activation checkpointing of a TransformerLM's block stack: strategies as plans, one runner.

A *plan* says which groups of blocks run under ``torch.utils.checkpoint.checkpoint(fn, x,
use_reentrant=False)``. It is plain data, so the cost model (``core.costs.checkpoint_memory``)
reads the same plan the runner executes: a tuple whose items are block indices (run as they
are) or tuples (sub-plans, each run under one checkpoint call, nesting allowed). The outermost
tuple itself is not checkpointed.

Strategies (``plan_for(name, num_layers)``):

- ``none``: ``(0, 1, ..., N-1)``; every block's saved tensors stay alive until backward.
- ``every_<k>``: one level, segments of k blocks (k divides N): ``((0, 1), (2, 3), ...)``.
  Forward keeps the N/k segment inputs; backward recomputes one segment at a time.
- ``sqrt``: one level, round(sqrt(N)) segments of near-equal size (larger ones first): the
  classic O(sqrt N) arrangement when k cannot divide N.
- ``halving``: recursive halving, ``((((0,), (1,)), ((2,), (3,))), ...)``: each half is a
  checkpoint of two checkpointed quarters, down to single blocks. At most one segment input
  per nesting level is alive (log2 N of them) plus one block's saved tensors: O(log N) memory
  for O(N log N) block forwards.
- ``chain``: nested prefixes, ``(((((0,), 1), 2), 3), 4)``: the last block runs plainly after a
  checkpoint of all blocks before it, recursively. Backward of block i recomputes blocks
  0..i-1 from the stack's input without keeping anything: O(1) memory (one input, one block)
  for O(N^2) block forwards.
- ``ffn``: selective, inside each block: the attention half keeps what it saves (the
  attention's inputs and output, the costliest work to redo at long context) and the FFN half
  (second norm and SwiGLU) keeps only its input and is recomputed in backward.
- ``attn``: selective, inside each block, the other half: the attention half (first norm and
  attention, with its (n x n) scores under naive attention) keeps only its input and is
  recomputed in backward; the FFN half keeps what it saves.
- ``halves``: both halves of every block, each under its own checkpoint call: a block keeps its
  input and the FFN half's input, and backward recomputes one half at a time (a smaller unit
  than ``every_1``, which recomputes the whole block at once).
- ``mixed_p<P>_f<F>``: the last P blocks plain, the F blocks before them as in ``ffn``, the
  rest each checkpointed alone (``every_1``): the arrangement a memory budget picks block by
  block (engine/memory_model.py), from none (P = N) through ``ffn`` (F = N) to ``every_1``.

Use: ``apply(model, "every_4")`` sets ``model.run_blocks`` (``model.run_in_order`` undoes it);
``run_plan(plan, blocks, x)`` runs any plan on any sequence of blocks.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a plan runs (run_plan): the report reads plans
    import torch

Plan = tuple  # items: int (a block) or Plan (a checkpointed group)

NESTED = ("sqrt", "halving", "chain")
# checkpointing inside a block: its attention half, its FFN half, or both, each on its own
SUB_BLOCK = ("attn", "ffn", "halves")
_EVERY = re.compile(r"^every_(\d+)$")
_MIXED = re.compile(r"^mixed_p(\d+)_f(\d+)$")


def strategy_name(block_size: int) -> str:
    """The name of one-level checkpointing in segments of `block_size` blocks."""
    return f"every_{block_size}"


def mixed_name(plain: int, ffn: int) -> str:
    """The strategy with the last `plain` blocks plain and `ffn` blocks before them FFN-only."""
    return f"mixed_p{plain}_f{ffn}"


def mixed_counts(name: str, num_layers: int) -> tuple[int, int] | None:
    """(plain, ffn) block counts of ``mixed_p<P>_f<F>`` and ``ffn``; None for the others."""
    if name == "ffn":
        return 0, num_layers
    m = _MIXED.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def ffn_blocks(name: str, num_layers: int) -> list[int]:
    """The blocks whose FFN half `name` checkpoints (``ffn``, ``mixed_*``)."""
    counts = mixed_counts(name, num_layers)
    if name == "halves":
        return list(range(num_layers))
    if counts is None:
        return []
    plain, ffn = counts
    return list(range(num_layers - plain - ffn, num_layers - plain))


def attn_blocks(name: str, num_layers: int) -> list[int]:
    """The blocks whose attention half `name` checkpoints (``attn``, ``halves``)."""
    return list(range(num_layers)) if name in ("attn", "halves") else []


def block_size_of(name: str) -> int | None:
    """k of ``every_<k>``; None for the other strategies."""
    m = _EVERY.match(name)
    return int(m.group(1)) if m else None


def _segments(sizes: Sequence[int]) -> Plan:
    out, start = [], 0
    for size in sizes:
        out.append(tuple(range(start, start + size)))
        start += size
    return tuple(out)


def _halving(lo: int, hi: int) -> Plan:
    """Blocks lo..hi-1 as a checkpointed group: a single block, or two checkpointed halves."""
    if hi - lo == 1:
        return (lo,)
    mid = (lo + hi) // 2
    return (_halving(lo, mid), _halving(mid, hi))


def _chain(n: int) -> Plan:
    """Blocks 0..n-1: a checkpoint of blocks 0..n-2 (itself a chain), then block n-1 plainly."""
    return (0,) if n == 1 else (_chain(n - 1), n - 1)


def plan_for(name: str, num_layers: int) -> Plan:
    """The plan of strategy `name` for a stack of `num_layers` blocks (module doc)."""
    n = num_layers
    if n < 1:
        raise ValueError(f"need at least one block, got {n}")
    if name == "none":
        return tuple(range(n))
    if (k := block_size_of(name)) is not None:
        if k < 1 or n % k:
            raise ValueError(f"block size {k} does not divide the {n} layers")
        return _segments([k] * (n // k))
    if name == "sqrt":
        m = max(1, round(math.sqrt(n)))
        return _segments([n // m + (i < n % m) for i in range(m)])
    if name == "halving":
        if n == 1:
            return ((0,),)
        mid = n // 2
        return (_halving(0, mid), _halving(mid, n))
    if name == "chain":
        return (0,) if n == 1 else (_chain(n - 1), n - 1)
    if name in ("attn", "halves"):  # inside the blocks: the stack runs as it is
        return tuple(range(n))
    if (counts := mixed_counts(name, n)) is not None:
        plain, ffn = counts
        if plain + ffn > n:
            raise ValueError(f"{name}: {plain} plain and {ffn} FFN-only blocks exceed {n}")
        full = n - plain - ffn
        return tuple((i,) for i in range(full)) + tuple(range(full, n))
    raise ValueError(
        f"unknown strategy {name!r}; known: none, every_<k>, {', '.join(NESTED)}, "
        f"{', '.join(SUB_BLOCK)}, mixed_p<P>_f<F>"
    )


def blocks_of(plan: Plan) -> list[int]:
    """The block indices a plan runs, in order (every block exactly once)."""
    out: list[int] = []
    for item in plan:
        out.extend(blocks_of(item) if isinstance(item, tuple) else [item])
    return out


def run_plan(plan: Plan, blocks: Sequence[torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
    """Run `blocks` on `x` as `plan` arranges them (nested tuples: checkpoint calls)."""
    from torch.utils.checkpoint import checkpoint

    for item in plan:
        if isinstance(item, tuple):
            x = checkpoint(run_plan, item, blocks, x, use_reentrant=False)
        else:
            x = blocks[item](x)
    return x


def apply(model: Any, strategy: str) -> Any:
    """Run `model`'s blocks (a TransformerLM: ``model.layers``) under `strategy`; returns it."""
    from cs336_systems.model import run_in_order

    plan = plan_for(strategy, len(model.layers))
    if blocks_of(plan) != list(range(len(model.layers))):  # pragma: no cover - a builder bug
        raise AssertionError(f"plan {plan} does not run every block once")
    ffn = set(ffn_blocks(strategy, len(model.layers)))
    attn = set(attn_blocks(strategy, len(model.layers)))
    for i, block in enumerate(model.layers):
        block.checkpoint_ffn = i in ffn
        block.checkpoint_attn = i in attn
    plain = all(isinstance(item, int) for item in plan)
    model.run_blocks = run_in_order if plain else functools.partial(run_plan, plan)
    return model
