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


# ---- the 2026 edition's names (the 2025 ones above stay) -----------------------------------


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    """DDP that all-reduces each gradient asynchronously as soon as backward produces it."""
    from cs336_systems.parallel.ddp import DDPOverlapIndividual

    return DDPOverlapIndividual(module)


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Fully sharded data parallel (`parallel/fsdp.py`): Linear and Embedding weights sharded,
    gathered per layer (cast to `compute_dtype` first), gradients reduce-scattered."""
    from cs336_systems.parallel.fsdp import FSDP

    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter at full size, keyed by the wrapped model's own names."""
    return fsdp_model.gather_full_params()


def get_sharded_optimizer(
    params: Any, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any
) -> torch.optim.Optimizer:
    from cs336_systems.parallel.sharded_optimizer import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)
