"""The official interface: what the course's tests and scripts call.

Imports are lazy so that using one part never pays for (or breaks on) another.
"""

from __future__ import annotations

from typing import Any

import torch


def get_flashattention_autograd_function_pytorch() -> type[torch.autograd.Function]:
    """FlashAttention-2 written in PyTorch: `.apply(Q, K, V, is_causal=False)`."""
    from cs336_systems.kernels.flash_pytorch import FlashAttentionPytorch

    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton() -> type[torch.autograd.Function]:
    """FlashAttention-2 with Triton forward and backward kernels: `.apply(Q, K, V, is_causal=False)`."""
    from cs336_systems.kernels.flash_triton import FlashAttentionTriton

    return FlashAttentionTriton


def get_ddp_individual_parameters(module: torch.nn.Module) -> torch.nn.Module:
    from cs336_systems.parallel.ddp import DDPOverlapIndividual

    return DDPOverlapIndividual(module)


def ddp_individual_parameters_on_after_backward(
    ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float) -> torch.nn.Module:
    from cs336_systems.parallel.ddp import DDPBucketed

    return DDPBucketed(module, bucket_size_mb=bucket_size_mb)


def ddp_bucketed_on_after_backward(
    ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(
    ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    ddp_model.on_train_batch_start()


def get_sharded_optimizer(
    params: Any, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any
) -> torch.optim.Optimizer:
    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)
