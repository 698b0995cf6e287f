"""The collectives DDP, FSDP and the sharded optimizer call, behind one replaceable indirection.

Every call goes through the module-level functions below (``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_reduce``, ``broadcast``), which hand it to the current
implementation: :class:`TorchCollectives` (torch.distributed) unless :func:`use` swapped in
another one, such as :class:`CountingCollectives`, which records calls and bytes per collective
kind and passes the call on::

    with collectives.counting() as counter:
        train_step()
    counter.totals()   # {"all_gather_into_tensor": {"calls": ..., "bytes": ..., ...}, ...}

Semantics are those of torch.distributed with ``ReduceOp.SUM``; every function takes
``async_op`` and then returns an object with ``wait()``.

Fallbacks, exactly equivalent to the collective they replace, for backends that lack it (older
gloo has no ``reduce_scatter_tensor``; no backend gathers tensors of uneven sizes into one):

- ``reduce_scatter_tensor``: an all-to-all of the chunks, then each rank sums the W chunks it
  received, in rank order (the same bytes on the wire as a ring reduce-scatter);
- ``all_gather_into_tensor``: the list all-gather, written into the output's chunks;
- uneven sizes: callers pad to equal chunks (FSDP pads the last shard), gather, and slice.

``TorchCollectives(ordered=True)`` makes every reduction add the ranks' contributions in rank
order, ((x0 + x1) + x2) + ..., identical on every rank and independent of the backend's
algorithm: reduce-scatter by the all-to-all above, all-reduce by an all-gather of every rank's
tensor and a local sum (W times the bytes of a ring all-reduce: for reproducibility and tests,
not for speed). With two ranks a SUM is the same either way (x0 + x1 = x1 + x0 exactly).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

KINDS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "broadcast")


class _Done:
    """The result of a collective that already finished (what a synchronous call returns)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Then:
    """Wait for `works`, then run `then()` once (the local part of a fallback)."""

    def __init__(self, works: list[Any], then: Callable[[], None]):
        self._works, self._then, self._done = works, then, False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            for work in self._works:
                work.wait()
            self._then()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


def _finish(work: Any, async_op: bool) -> Any:
    if async_op:
        return work
    work.wait()
    return _Done()


def _unsupported(exc: BaseException) -> bool:
    """Whether a collective failed because the backend does not implement it."""
    msg = str(exc).lower()
    return isinstance(exc, NotImplementedError) or any(
        s in msg for s in ("not support", "not implemented", "unsupported")
    )


class TorchCollectives:
    """torch.distributed, with the exactly equivalent fallbacks described in the module doc.

    `fallback`: names of collectives to run through their fallback even where the backend has
    them (tests use it); a collective the backend turns out to lack is added to it on first use.
    """

    def __init__(self, ordered: bool = False, fallback: set[str] | None = None):
        self.ordered = ordered
        self.fallback: set[str] = set(fallback or ())

    def all_gather_into_tensor(self, output, input, group=None, async_op=False):
        if "all_gather_into_tensor" not in self.fallback:
            try:
                return _finish(
                    dist.all_gather_into_tensor(output, input, group=group, async_op=True),
                    async_op,
                )
            except (RuntimeError, NotImplementedError) as exc:
                if not _unsupported(exc):
                    raise
                self.fallback.add("all_gather_into_tensor")
        world = dist.get_world_size(group)
        chunks = list(output.view(-1).chunk(world))
        if all(c.is_contiguous() for c in chunks):
            return _finish(dist.all_gather(chunks, input, group=group, async_op=True), async_op)
        parts = [torch.empty_like(input) for _ in range(world)]
        work = dist.all_gather(parts, input, group=group, async_op=True)
        return _finish(_Then([work], lambda: output.view(-1).copy_(torch.cat(parts))), async_op)

    def reduce_scatter_tensor(self, output, input, group=None, async_op=False):
        if not self.ordered and "reduce_scatter_tensor" not in self.fallback:
            try:
                return _finish(
                    dist.reduce_scatter_tensor(output, input, group=group, async_op=True),
                    async_op,
                )
            except (RuntimeError, NotImplementedError) as exc:
                if not _unsupported(exc):
                    raise
                self.fallback.add("reduce_scatter_tensor")
        world = dist.get_world_size(group)
        received = torch.empty_like(input)
        work = dist.all_to_all_single(received, input.contiguous(), group=group, async_op=True)

        def rank_order_sum() -> None:
            parts = received.view(world, -1)
            acc = parts[0].clone()
            for r in range(1, world):
                acc += parts[r]
            output.view(-1).copy_(acc)

        return _finish(_Then([work], rank_order_sum), async_op)

    def all_reduce(self, tensor, group=None, async_op=False):
        if not self.ordered:
            return _finish(
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True), async_op
            )
        world = dist.get_world_size(group)
        flat = tensor.reshape(-1).contiguous()
        every = torch.empty(world * flat.numel(), dtype=tensor.dtype, device=tensor.device)
        work = dist.all_gather_into_tensor(every, flat, group=group, async_op=True)

        def rank_order_sum() -> None:
            parts = every.view(world, -1)
            acc = parts[0].clone()
            for r in range(1, world):
                acc += parts[r]
            tensor.copy_(acc.view(tensor.shape))

        return _finish(_Then([work], rank_order_sum), async_op)

    def broadcast(self, tensor, src, group=None, async_op=False):
        return _finish(dist.broadcast(tensor, src=src, group=group, async_op=True), async_op)


@dataclass
class Counts:
    calls: int = 0
    bytes: int = 0  # the collective's size S (see CountingCollectives)
    wire_bytes: float = 0.0  # bytes one rank sends under the ring algorithm


@dataclass
class CountingCollectives:
    """Counts calls and bytes per collective kind, then passes each call to `inner`.

    `bytes` is the collective's size S: the gathered output of an all-gather, the input of a
    reduce-scatter, the tensor of an all-reduce or broadcast. `wire_bytes` is what one rank
    sends with ring algorithms on W ranks: (W-1)/W S for all-gather and reduce-scatter,
    2 (W-1)/W S for all-reduce, S for a (pipelined) broadcast.
    """

    inner: Any = field(default_factory=TorchCollectives)
    counts: dict[str, Counts] = field(default_factory=lambda: {k: Counts() for k in KINDS})

    def _count(self, kind: str, nbytes: int, group) -> None:
        world = dist.get_world_size(group)
        factor = {"all_reduce": 2 * (world - 1) / world, "broadcast": 1.0}.get(
            kind, (world - 1) / world
        )
        c = self.counts[kind]
        c.calls += 1
        c.bytes += nbytes
        c.wire_bytes += factor * nbytes

    def all_gather_into_tensor(self, output, input, group=None, async_op=False):
        self._count("all_gather_into_tensor", output.numel() * output.element_size(), group)
        return self.inner.all_gather_into_tensor(output, input, group=group, async_op=async_op)

    def reduce_scatter_tensor(self, output, input, group=None, async_op=False):
        self._count("reduce_scatter_tensor", input.numel() * input.element_size(), group)
        return self.inner.reduce_scatter_tensor(output, input, group=group, async_op=async_op)

    def all_reduce(self, tensor, group=None, async_op=False):
        self._count("all_reduce", tensor.numel() * tensor.element_size(), group)
        return self.inner.all_reduce(tensor, group=group, async_op=async_op)

    def broadcast(self, tensor, src, group=None, async_op=False):
        self._count("broadcast", tensor.numel() * tensor.element_size(), group)
        return self.inner.broadcast(tensor, src, group=group, async_op=async_op)

    def reset(self) -> None:
        self.counts = {k: Counts() for k in KINDS}

    def totals(self) -> dict[str, dict[str, float]]:
        return {k: vars(c).copy() for k, c in self.counts.items()}


_impl: Any = TorchCollectives()


def current() -> Any:
    """The implementation every call goes to now."""
    return _impl


@contextlib.contextmanager
def use(impl: Any) -> Iterator[Any]:
    """Route every collective through `impl` inside the block (restored after it)."""
    global _impl
    previous, _impl = _impl, impl
    try:
        yield impl
    finally:
        _impl = previous


@contextlib.contextmanager
def counting() -> Iterator[CountingCollectives]:
    """Count the bytes of every collective inside the block, per kind (this rank's calls)."""
    with use(CountingCollectives(inner=_impl)) as counter:
        yield counter


def all_gather_into_tensor(output, input, group=None, async_op=False):
    return _impl.all_gather_into_tensor(output, input, group=group, async_op=async_op)


def reduce_scatter_tensor(output, input, group=None, async_op=False):
    return _impl.reduce_scatter_tensor(output, input, group=group, async_op=async_op)


def all_reduce(tensor, group=None, async_op=False):
    return _impl.all_reduce(tensor, group=group, async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False):
    return _impl.broadcast(tensor, src, group=group, async_op=async_op)
