"""Hooks on tensors that do not keep their owner alive.

A tensor keeps its hooks on the C++ side, where Python's garbage collector cannot see them: a
hook bound to the wrapper that owns the tensor's module makes a cycle nothing frees (a whole model
and its gradients per wrapper built, 33 GB a rank at 8B). DDP and FSDP register theirs through
`weak_hook`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable


def weak_hook(method: Callable) -> Callable:
    """A hook that calls the bound `method` while its object lives, and does nothing after."""
    ref = weakref.WeakMethod(method)

    def hook(*args):
        bound = ref()
        return None if bound is None else bound(*args)

    return hook
