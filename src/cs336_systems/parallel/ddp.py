"""Data-parallel training wrappers, from the simplest to the one that overlaps best.

Each wrapper takes any ``nn.Module``, broadcasts rank 0's parameters and buffers at construction
(so every rank starts from the same model), exposes the wrapped model as ``.module`` and
averages the gradients of the parameters that require grad across the process group (every
collective through `parallel.collectives`, so a counting wrapper sees them). A
parameter shared by two modules (tied weights) is one ``nn.Parameter`` with one ``.grad`` and is
communicated exactly once; frozen parameters are never communicated.

The training loop is the same for every variant::

    ddp = DDPBucketed(model, bucket_size_mb=25)
    for batch in data:
        ddp.on_train_batch_start()
        loss = loss_fn(ddp(batch))
        loss.backward()
        ddp.finish_gradient_synchronization()   # gradients are averaged after this returns
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

- ``DDPNaive``: after backward, one blocking all-reduce per parameter.
- ``DDPFlat``: after backward, one all-reduce of all gradients flattened into one buffer.
- ``DDPOverlapIndividual``: each gradient's all-reduce starts asynchronously from a
  post-accumulate-grad hook while backward goes on; ``finish_gradient_synchronization`` waits.
- ``DDPBucketed``: gradients are gathered into buckets of at most ``bucket_size_mb`` (filled in
  reverse parameter order, roughly the order backward produces them); a bucket is flattened and
  all-reduced asynchronously as soon as its last gradient is ready.

Averaging divides by the world size before the sum (gloo has no AVG reduction). A parameter that
requires grad but got no gradient in a step keeps ``grad=None``, as in single-process training;
every rank must then leave the same parameters unused (as torch's DDP without
``find_unused_parameters``), or the ranks' collectives no longer match.

A parameter's gradient can be accumulated more than once in one step: a weight tied between a
reentrant-checkpointed segment and the rest of the model (the segment's backward is a separate
autograd pass), or two backward passes before synchronizing. Its post-accumulate-grad hook then
fires once per accumulation, and the next accumulation adds into ``.grad`` in place, while the
all-reduce started by the previous hook may still be reading or writing it (a data race: the
sum then depends on which thread got there first). So the overlapping variants also hook in
before each accumulation: an all-reduce of that gradient still in flight is finished first, and
the gradient is sent again once the new part is in. Sending the sum again is exact: the earlier
part is already the average, the same on every rank, and averaging leaves it unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336_systems.core.costs import MiB
from cs336_systems.parallel import collectives
from cs336_systems.parallel.hooks import weak_hook


def _group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def _src_rank(group: dist.ProcessGroup | None) -> int:
    """Global rank of the group's rank 0 (broadcast's `src` is a global rank)."""
    return 0 if group is None else dist.get_global_rank(group, 0)


class _DataParallelBase(nn.Module):
    """Shared construction: broadcast, parameter bookkeeping, forward and hook cleanup."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialize torch.distributed before wrapping a model for DDP")
        self.module = module
        self.process_group = process_group
        self.world_size = _group_size(process_group)
        self._hook_handles: list[Any] = []
        src = _src_rank(process_group)
        with torch.no_grad():
            # parameters() and buffers() yield a shared tensor once: tied weights go once
            for tensor in [*module.parameters(), *module.buffers()]:
                collectives.broadcast(tensor.data, src, group=process_group)
        # the tensors to synchronize, in registration order, each once
        self.sync_params: list[nn.Parameter] = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        """Called before each step's forward; the bucketed variant resets its bookkeeping."""

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    def remove_hooks(self) -> None:
        """Detach this wrapper's autograd hooks (so another wrapper can take the module)."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()

    def _all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        tensor.div_(self.world_size)
        return collectives.all_reduce(tensor, group=self.process_group, async_op=async_op)


class DDPNaive(_DataParallelBase):
    """One blocking all-reduce per parameter gradient, after backward."""

    def finish_gradient_synchronization(self) -> None:
        for p in self.sync_params:
            if p.grad is not None:
                self._all_reduce(p.grad)


def _dtype_groups(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Consecutive runs of parameters sharing dtype and device (one flat buffer each)."""
    groups: list[list[nn.Parameter]] = []
    for p in params:
        if groups and (groups[-1][0].dtype, groups[-1][0].device) == (p.dtype, p.device):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


class DDPFlat(_DataParallelBase):
    """One all-reduce of all gradients flattened into one buffer (per dtype), after backward."""

    def finish_gradient_synchronization(self) -> None:
        for group in _dtype_groups(self.sync_params):
            grads = [p.grad for p in group if p.grad is not None]
            if not grads:
                continue
            flat = _flatten_dense_tensors(grads)
            self._all_reduce(flat)
            torch._foreach_copy_(grads, _unflatten_dense_tensors(flat, grads))


def _hook_accumulation(ddp: _DataParallelBase, before, after) -> None:
    """`before(p)` just before each accumulation into p.grad (a tensor hook on the leaf runs
    before AccumulateGrad), `after(p)` just after it, for every parameter `ddp` synchronizes."""
    before, after = weak_hook(before), weak_hook(after)  # a dropped wrapper frees its model
    for p in ddp.sync_params:
        ddp._hook_handles.append(p.register_hook(lambda grad, p=p: before(p)))
        ddp._hook_handles.append(p.register_post_accumulate_grad_hook(after))


class DDPOverlapIndividual(_DataParallelBase):
    """Asynchronous all-reduce of each gradient as soon as backward has accumulated it."""

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None):
        super().__init__(module, process_group)
        self._pending: dict[int, Any] = {}  # id(parameter) -> its all-reduce in flight
        _hook_accumulation(self, self._before_accumulation, self._on_grad_ready)

    def _before_accumulation(self, p: nn.Parameter) -> None:
        # more gradient is about to be added into p.grad: its all-reduce in flight (in place on
        # p.grad) finishes first (module doc)
        work = self._pending.pop(id(p), None)
        if work is not None:
            work.wait()

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        self._pending[id(p)] = self._all_reduce(p.grad, async_op=True)

    def finish_gradient_synchronization(self) -> None:
        for work in self._pending.values():
            work.wait()
        self._pending.clear()


class _Bucket:
    __slots__ = ("params", "ready", "work", "flat")

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.ready: set[int] = set()  # id() of the parameters whose gradient is in
        self.work: Any = None
        self.flat: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


class DDPBucketed(_DataParallelBase):
    """Gradients in buckets of at most `bucket_size_mb`, each all-reduced once it is full.

    Buckets are filled in reverse registration order (the last layers' gradients are ready
    first in backward). A parameter larger than the bucket size gets a bucket of its own.
    """

    def __init__(
        self,
        module: nn.Module,
        bucket_size_mb: float,
        process_group: dist.ProcessGroup | None = None,
    ):
        super().__init__(module, process_group)
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
        self.bucket_size_mb = bucket_size_mb
        self.buckets = self._make_buckets(bucket_size_mb * MiB)
        self._bucket_of: dict[int, _Bucket] = {}
        for bucket in self.buckets:
            for p in bucket.params:
                self._bucket_of[id(p)] = bucket
        _hook_accumulation(self, self._before_accumulation, self._on_grad_ready)

    def _make_buckets(self, limit_bytes: float) -> list[_Bucket]:
        buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(self.sync_params):
            nbytes = p.numel() * p.element_size()
            same_kind = buckets and (buckets[-1][0].dtype, buckets[-1][0].device) == (
                p.dtype,
                p.device,
            )
            if buckets and same_kind and size + nbytes <= limit_bytes:
                buckets[-1].append(p)
                size += nbytes
            else:
                buckets.append([p])
                size = nbytes
        return [_Bucket(ps) for ps in buckets]

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    def on_train_batch_start(self) -> None:
        for bucket in self.buckets:
            if bucket.work is not None:  # a step that never finished: drain it first
                bucket.work.wait()
            bucket.ready, bucket.work, bucket.flat = set(), None, None

    def _launch(self, bucket: _Bucket) -> None:
        # a parameter without a gradient this step contributes zeros and stays grad=None
        parts = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        bucket.flat = _flatten_dense_tensors(parts)  # one tensor: a view of its .grad
        bucket.work = self._all_reduce(bucket.flat, async_op=True)

    def _complete(self, bucket: _Bucket) -> None:
        """Wait for the bucket's all-reduce, write the averages into the gradients, and start
        the bucket over (no gradient counted in)."""
        bucket.work.wait()
        synced = _unflatten_dense_tensors(bucket.flat, [p.data for p in bucket.params])
        pairs = [
            (p.grad, s) for p, s in zip(bucket.params, synced, strict=True) if p.grad is not None
        ]
        if pairs:
            torch._foreach_copy_([g for g, _ in pairs], [s for _, s in pairs])
        bucket.ready, bucket.work, bucket.flat = set(), None, None

    def _before_accumulation(self, p: nn.Parameter) -> None:
        # more gradient for a parameter whose bucket was already sent (module doc): the bucket
        # completes first, then collects again; the parameters that get no more gradient this
        # step send their averages again from finish_gradient_synchronization (unchanged)
        bucket = self._bucket_of[id(p)]
        if bucket.work is not None:
            self._complete(bucket)

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        bucket = self._bucket_of[id(p)]
        bucket.ready.add(id(p))  # a set: a second accumulation does not count twice
        if len(bucket.ready) == len(bucket.params):
            self._launch(bucket)

    def finish_gradient_synchronization(self) -> None:
        for bucket in self.buckets:  # buckets holding a parameter that got no gradient
            if bucket.work is None:
                self._launch(bucket)
        for bucket in self.buckets:
            self._complete(bucket)


DDP_VARIANTS: dict[str, type[_DataParallelBase]] = {
    "naive": DDPNaive,
    "flat": DDPFlat,
    "overlap": DDPOverlapIndividual,
    "bucketed": DDPBucketed,
}


def wrap(module: nn.Module, variant: str, bucket_size_mb: float | None = None) -> _DataParallelBase:
    """Wrap `module` in the DDP variant named `variant` (a key of DDP_VARIANTS)."""
    if variant not in DDP_VARIANTS:
        raise ValueError(f"unknown DDP variant {variant!r}; known: {sorted(DDP_VARIANTS)}")
    if variant == "bucketed":
        if bucket_size_mb is None:
            raise ValueError("the bucketed variant needs bucket_size_mb")
        return DDPBucketed(module, bucket_size_mb=bucket_size_mb)
    return DDP_VARIANTS[variant](module)
