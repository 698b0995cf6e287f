"""Optimizer-state sharding: each rank keeps the optimizer state of its shard of the parameters.

``ShardedOptimizer(params, optimizer_cls, **kwargs)`` assigns every parameter to one owner rank
(greedily, to the rank holding the fewest elements so far, so shards stay balanced), builds one
``optimizer_cls`` over the parameters this rank owns, and in ``step`` updates them and then
broadcasts each parameter from its owner so that all ranks hold the same model again. Gradients
must already be identical on all ranks (a DDP wrapper averaged them).

Per rank this keeps ~1/world_size of the optimizer state (for AdamW two fp32 moments, 8 bytes per
parameter); parameters and gradients stay replicated. That is the partitioning of ZeRO stage 1;
unlike DeepSpeed's ZeRO-1 (which reduce-scatters the gradients and all-gathers the updated flat
parameter partitions) it keeps the plain all-reduce of gradients and one broadcast per parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from cs336_systems.parallel import collectives


class ShardedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer_cls`; `param_groups` lists all parameters, the inner optimizer its shard."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        optimizer_cls: type[torch.optim.Optimizer],
        **kwargs: Any,
    ):
        if not dist.is_initialized():
            raise RuntimeError("initialize torch.distributed before building a ShardedOptimizer")
        self.optimizer_cls = optimizer_cls
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.owner: dict[int, int] = {}  # id(param) -> rank that updates it
        self.shard_numel = [0] * self.world_size
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._inner_kwargs = kwargs
        super().__init__(params, defaults=kwargs)  # calls add_param_group for each group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            rank = min(range(self.world_size), key=lambda r: (self.shard_numel[r], r))
            self.owner[id(p)] = rank
            self.shard_numel[rank] += p.numel()
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p in group["params"] if self.owner[id(p)] == self.rank]
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local], **self._inner_kwargs)
        else:
            self.local_optimizer.add_param_group(local)
        # show the inner optimizer's defaults (lr, betas, ...) in our groups, for schedulers
        for key, value in self.local_optimizer.param_groups[-1].items():
            group.setdefault(key, value)

    def _sync_hyperparameters(self) -> None:
        """Carry changes made to our groups (an LR schedule) into the inner optimizer's."""
        assert self.local_optimizer is not None
        for outer, inner in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            for key, value in outer.items():
                if key != "params":
                    inner[key] = value

    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        works = [
            collectives.broadcast(p.data, self.owner[id(p)], async_op=True)
            for group in self.param_groups
            for p in group["params"]
        ]
        for work in works:
            work.wait()

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        assert self.local_optimizer is not None
        self._sync_hyperparameters()
        loss = self.local_optimizer.step(closure, **kwargs)
        self._broadcast_parameters()
        return loss

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state (all tensors in `state`) this rank holds."""
        assert self.local_optimizer is not None
        return sum(
            v.numel() * v.element_size()
            for state in self.local_optimizer.state.values()
            for v in state.values()
            if torch.is_tensor(v)
        )
