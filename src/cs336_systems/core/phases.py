"""Phase markers: profiler ranges (NVTX and torch.profiler) around the phases of a training
step (forward, backward, optimizer), set by hooks so the step itself needs no changes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

PHASES = ("forward", "backward", "optimizer", "other")


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """One range under both profilers: an NVTX push/pop and a torch.profiler record_function."""
    torch.cuda.nvtx.range_push(name)
    try:
        with torch.autograd.profiler.record_function(name):
            yield
    finally:
        torch.cuda.nvtx.range_pop()


MARKERS = {
    "phase.forward": "forward",
    "phase.backward": "backward",
    "phase.optimizer": "optimizer",
    "phase.optimizer_end": "other",
}


@contextmanager
def phase_hooks(model: torch.nn.Module, mark: Callable[[str], None]) -> Iterator[None]:
    """Call `mark(name)` at the phase boundaries of whatever step runs `model`.

    forward: before the model's forward; backward: when the gradient of the model's output is
    ready (the loss's own backward comes just before it); optimizer / optimizer_end: around any
    `Optimizer.step`. The markers are zero-length ranges, so a step needs no changes.
    """
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    def forward_pre(_module, _args):
        mark("phase.forward")

    def forward_post(_module, _args, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda _grad: mark("phase.backward"))

    handles = [
        model.register_forward_pre_hook(forward_pre),
        model.register_forward_hook(forward_post),
        register_optimizer_step_pre_hook(lambda *_: mark("phase.optimizer")),
        register_optimizer_step_post_hook(lambda *_: mark("phase.optimizer_end")),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _zero_length_range(name: str) -> None:
    with annotate(name):
        pass


class PhaseRanges:
    """Zero-length markers for the attribution, plus NVTX start/end ranges `forward`,
    `backward`, `optimizer` for people reading the timeline in Nsight Systems (start/end
    ranges, unlike push/pop, may begin on the main thread and end on the autograd thread)."""

    def __init__(self):
        self.open: int | None = None

    def close(self) -> None:
        if self.open is not None:
            torch.cuda.nvtx.range_end(self.open)
            self.open = None

    def __call__(self, name: str) -> None:
        _zero_length_range(name)
        self.close()
        phase = MARKERS.get(name, "other")
        if phase != "other":
            self.open = torch.cuda.nvtx.range_start(phase)
