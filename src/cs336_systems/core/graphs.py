"""A training step's forward and backward captured once as CUDA graphs and replayed each step.

    graphed = GraphedStep(forward, backward, zero_grad)   # forward() -> loss; backward(loss)
    graphed.warm_up(); graphed.capture()                   # eager steps, then the two captures
    for _ in range(steps):
        graphed.forward(); graphed.backward()              # one graph launch each
        optimizer.step()                                   # eager, reads the graph's gradients

`backward(loss)` runs autograd and whatever must finish before the optimizer (a data-parallel
wrapper's gradient synchronization: its collectives are captured with the kernels, each on its
own stream as issued, joined back by the wrapper's waits). `warm_up()` runs `eager_steps`
steps on a side stream (lazy initialization: cuBLAS workspaces, NCCL communicators, compiled
code, a wrapper's learned gather order); `capture()` then captures the forward in one graph and the backward
in a second that shares its memory pool (autograd's saved tensors stay where the forward graph
wrote them). A replay is one launch whatever the kernels: a step whose host time per kernel
exceeds the kernel's (an FSDP unit's hooks, many small launches) no longer makes the GPU wait.

What capture changes, CUDA graphs' rules:
- inputs are the tensors `forward` captured: copy new data into them (`forward` closes over
  them);
- gradients live in the graph's pool and every backward replay overwrites them: after capture
  the optimizer must not set them to None (`zero_grad` runs only between the eager steps);
- nothing inside may synchronize with the host, and every tensor a replay writes was allocated
  during capture: memory the eager step frees and reuses stays reserved by the graphs, so
  ``torch.cuda.memory_allocated`` undercounts what a replay uses (``memory_reserved`` holds it);
- the captured collectives run on every replay in the order captured: every rank must capture
  the same step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# the capturing thread alone is checked for calls a capture forbids: NCCL's watchdog and
# autograd's device threads query and launch on their own
CAPTURE_MODE = "thread_local"


class GraphedStep:
    """`forward() -> loss` and `backward(loss)` as two CUDA graphs (module doc)."""

    def __init__(
        self,
        forward: Callable[[], torch.Tensor],
        backward: Callable[[torch.Tensor], None],
        zero_grad: Callable[[], None],
        eager_steps: int = 2,
    ):
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device")
        if eager_steps < 1:
            raise ValueError(f"need eager_steps >= 1 before a capture, got {eager_steps}")
        self._forward, self._backward, self._zero_grad = forward, backward, zero_grad
        self.eager_steps = eager_steps
        self.loss: torch.Tensor | None = None  # the forward graph's output, refreshed by replays
        self._graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None
        self._warm = False

    @property
    def captured(self) -> bool:
        return self._graphs is not None

    def warm_up(self) -> None:
        """The eager steps a capture needs first (their gradients set to None after each)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.eager_steps):
                self._backward(self._forward())
                self._zero_grad()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self._warm = True

    def capture(self) -> None:
        """Capture one forward and one backward (they do not run: the first replay does)."""
        if not self._warm:
            self.warm_up()
        fwd, bwd = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(fwd, capture_error_mode=CAPTURE_MODE):
            loss = self._forward()
        with torch.cuda.graph(bwd, pool=fwd.pool(), capture_error_mode=CAPTURE_MODE):
            self._backward(loss)
        torch.cuda.synchronize()
        self.loss = loss.detach()
        self._graphs = (fwd, bwd)

    def forward(self) -> torch.Tensor:
        """Replay the forward; the loss tensor it writes."""
        if self._graphs is None:
            raise RuntimeError("GraphedStep.forward before capture()")
        self._graphs[0].replay()
        return self.loss

    def backward(self) -> None:
        """Replay the backward (and what `backward` synchronized) of the last forward."""
        if self._graphs is None:
            raise RuntimeError("GraphedStep.backward before capture()")
        self._graphs[1].replay()
