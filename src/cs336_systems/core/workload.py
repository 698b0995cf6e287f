"""The workload every model-level stage measures: a model, a batch and an optimizer on a device."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cs336_systems.core import own_model
from cs336_systems.core.costs import param_count
from cs336_systems.core.device import autocast
from cs336_systems.model import (
    BATCH_SIZE,
    VOCAB_SIZE,
    build_model,
    edition_of,
    make_optimizer,
    size_spec,
)

MODES = ("forward", "forward_backward", "train_step")
# the phases of a step (`step(clock)`'s marks) each mode has: name -> (mark, mark)
PHASE_SPANS = {
    "forward": {"fwd": ("start", "forward")},
    "forward_backward": {"fwd": ("start", "forward"), "bwd": ("forward", "backward")},
    "train_step": {
        "fwd": ("start", "forward"),
        "bwd": ("forward", "backward"),
        "opt": ("backward", "optimizer"),
    },
}


def model_columns(
    size: str,
    edition: int | str | None,
    vocab_size: int = VOCAB_SIZE,
    context_length: int = 16,
    batch_size: int = 1,
) -> dict:
    """What a row says of its model: the edition, the size name and its resolved dimensions
    (d_model, d_ff, num_layers, num_heads) and exact parameter count (core/costs.py); an own
    model (core/own_model.py) its name, its counted parameters and where its FLOPs come from."""
    if (own := own_model.spec_for(size)) is not None:
        about = own_model.describe(own, context_length, batch_size)
        return {
            "edition": edition_of(edition),
            "size": size,
            "own_model": own.factory,
            "params": about["params"],
            "flops_source": about["flops_source"],
        }
    spec = size_spec(size, edition)
    return {
        "edition": edition_of(edition),
        "size": size,
        **spec,
        "params": param_count(vocab_size, spec["d_model"], spec["num_layers"], spec["d_ff"]),
    }


def rank_batch(seed: int, rank: int, batch: int, context_length: int, device):
    """(inputs, targets) of one rank in the distributed stages: random tokens of its own seed
    (`seed + 1000 (rank + 1)`, drawn on the CPU so every device gets the same ones)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1000 * (rank + 1))
    tokens = torch.randint(0, VOCAB_SIZE, (batch, context_length + 1), generator=gen)
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


@dataclass
class Workload:
    """A model with its data on a device; `step(mode, precision, compiled)` builds a step."""

    model: torch.nn.Module
    tokens: torch.Tensor
    targets: torch.Tensor
    device: torch.device
    compile_mode: str = "default"
    _compiled: torch.nn.Module | None = None
    # an own model's (core/own_model.py): its inputs may be a mapping or tuple, its output
    # HuggingFace's (`.logits`)
    own: bool = False

    @classmethod
    def build(
        cls,
        size: str,
        context_length: int,
        batch_size: int = BATCH_SIZE,
        device: torch.device | str = "cpu",
        attention: str | Callable = "naive",
        seed: int = 0,
        compile_mode: str = "default",
        edition: int | str | None = None,
    ) -> Workload:
        device = torch.device(device)
        torch.manual_seed(seed)
        if (own := own_model.spec_for(size)) is not None:  # the attention is its own
            with device:
                model = own_model.build(own, context_length)
            tokens, targets = own_model.make_batch(own, batch_size, context_length, device)
            return cls(model, tokens, targets, device, compile_mode, own=True)
        with device:
            model = build_model(size, context_length, edition=edition).set_attention(attention)
        shape = (batch_size, context_length)
        tokens = torch.randint(0, VOCAB_SIZE, shape, device=device)
        targets = torch.randint(0, VOCAB_SIZE, shape, device=device)
        return cls(model, tokens, targets, device, compile_mode)

    def forward_module(self, compiled: bool) -> torch.nn.Module:
        if not compiled:
            return self.model
        if self._compiled is None:
            self._compiled = torch.compile(self.model, mode=self.compile_mode)
        return self._compiled

    def step(
        self, mode: str, precision: str, compiled: bool
    ) -> tuple[Callable[..., None], Callable]:
        """(step, cleanup): one call of `step` is one measured unit of `mode`. `step(clock)`
        marks its phases on a harness StepClock: `start` (after the gradients are set to None,
        in forward_backward as in train_step, as a training loop does: each backward writes
        them fresh instead of adding into the last step's, so the two modes' backwards are the
        same work),
        `forward` (the loss computed), `backward`, `optimizer` (the AdamW step), as far as the
        mode goes (PHASE_SPANS names the spans between them)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; known: {MODES}")
        net = self.forward_module(compiled)
        optimizer = make_optimizer(self.model) if mode == "train_step" else None

        def loss() -> torch.Tensor:
            with autocast(precision, self.device):
                if self.own:
                    return own_model.loss_of(net, self.tokens, self.targets)
                logits = net(self.tokens)
                return F.cross_entropy(logits.flatten(0, 1).float(), self.targets.flatten())

        def step(clock=None) -> None:
            mark = clock.mark if clock is not None else (lambda _name: None)
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            elif mode == "forward_backward":
                self.model.zero_grad(set_to_none=True)
            mark("start")
            value = loss()
            mark("forward")
            if mode == "forward":
                return
            value.backward()
            mark("backward")
            if optimizer is not None:
                optimizer.step()
                mark("optimizer")

        def cleanup() -> None:
            nonlocal optimizer
            self.model.zero_grad(set_to_none=True)
            optimizer = None

        return step, cleanup
