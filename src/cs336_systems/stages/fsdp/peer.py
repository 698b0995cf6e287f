"""The peer the stage measures FSDP against: PyTorch's own, `torch.distributed.fsdp.fully_shard`
(FSDP2), set up as this project's FSDP by block is: each TransformerBlock a unit, the root (the
embedding, the final norm and the LM head) one more, gathered in the compute dtype and reduced in
it (`MixedPrecisionPolicy(param_dtype=reduce_dtype=compute dtype)`), resharded after forward,
with the next block's all-gather prefetched explicitly one block ahead in forward and in
backward (torchtitan's setting for host-bound steps). Behind the stage's wrapper interface:
`finish_gradient_synchronization` has nothing to do (FSDP2 waits for its reduce-scatters when
backward ends), and the parameters are DTensors whose local shards are what a rank holds.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


class TorchFSDP(nn.Module):
    is_peer = True
    units_kind = "block"
    peak_resident_bytes = math.nan  # FSDP2 does not report its gathered bytes

    def __init__(self, model: nn.Module, compute_dtype: torch.dtype):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        super().__init__()
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=compute_dtype)
        from cs336_systems.core.own_model import repeated_blocks

        # the blocks: the largest ModuleList (the course's `layers`, an own model's own)
        _, blocks = repeated_blocks(model) or ("", [])
        for block in blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        for block, after in zip(blocks, blocks[1:], strict=False):
            block.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([block])
        self.module = model
        # all-gathers run in the order issued: the root's and one per block in forward
        self.forward_gathers = len(blocks) + 1

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """Nothing left: FSDP2's reduce-scatters are waited for when backward ends."""


def local(t: torch.Tensor) -> torch.Tensor:
    """A rank's own part of a tensor: a DTensor's local shard, any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t
