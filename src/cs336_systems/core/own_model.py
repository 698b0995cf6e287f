"""A model of your own, named by the config's `own_model` key (planning/own_model.py,
docs/own-model.md): its factory and batch builder loaded, the model built, its batch drawn,
its logits read, and what its rows say of it (`describe`: parameters and each mode's FLOPs,
`counted` on the meta device by torch.utils.flop_counter or from the `declared`
flops_per_token).

    python -m cs336_systems.core.own_model check '{"name": ..., "factory": ...}'

prints the factories' problems as one JSON list (the workflow's config check runs it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from cs336_systems.core.costs import MODE_MULTIPLIER
from cs336_systems.model import VOCAB_SIZE
from cs336_systems.planning.own_model import ENV, KEY

FACTORY = "package.module:function"


class OwnModelError(ValueError):
    """A factory that cannot serve: `key` (factory, batch), its value, what is allowed."""

    def __init__(self, key: str, value, allowed: str):
        super().__init__(f"{KEY}.{key}: {value!r} — {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


@dataclass(frozen=True)
class OwnModel:
    name: str
    factory: str
    batch: str | None = None
    flops_per_token: float | None = None


def current() -> OwnModel | None:
    """The run's own model (the jobs' environment, planning/own_model.py: ENV), or None."""
    text = os.environ.get(ENV)
    return OwnModel(**json.loads(text)) if text else None


def spec_for(size: str) -> OwnModel | None:
    """The own model where `size` names it, else None (a course size)."""
    own = current()
    return own if own is not None and own.name == size else None


def load(key: str, path: str):
    """The callable `package.module:function` named by `key`."""
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as exc:  # noqa: BLE001 (any failure to import is the user's to see)
        why = f"{FACTORY} that imports ({type(exc).__name__}: {exc})"
        raise OwnModelError(key, path, why) from exc
    if not callable(fn):
        raise OwnModelError(key, path, f"{FACTORY} naming a callable, not a {type(fn).__name__}")
    return fn


def _call(fn, **kwargs):
    """`fn` called with the keywords its signature accepts."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**kwargs)
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def build(own: OwnModel, context_length: int) -> torch.nn.Module:
    """The factory's model (on the current default device: `with device:`), checked to be an
    nn.Module with parameters."""
    fn = load("factory", own.factory)
    try:
        model = _call(fn, vocab_size=VOCAB_SIZE, context_length=context_length)
    except Exception as exc:  # noqa: BLE001
        raise OwnModelError("factory", own.factory, f"a factory that builds ({exc})") from exc
    if not isinstance(model, torch.nn.Module):
        what = type(model).__name__
        raise OwnModelError("factory", own.factory, f"a factory returning an nn.Module, not {what}")
    if not any(True for _ in model.parameters()):
        raise OwnModelError("factory", own.factory, "a factory returning a model with parameters")
    return model


def module_for(size: str, context_length: int, edition=None) -> torch.nn.Module:
    """The model a stage's `size` names: the own model where it names one, else the course's
    (model.build_model), on the current default device."""
    from cs336_systems.model import build_model

    if (own := spec_for(size)) is not None:
        return build(own, context_length)
    return build_model(size, context_length, edition=edition)


def make_batch(own: OwnModel, batch_size: int, context_length: int, device) -> tuple:
    """(inputs, targets) of one step: the batch builder's, or random token ids."""
    if own.batch is None:
        shape = (batch_size, context_length)
        tokens = torch.randint(0, VOCAB_SIZE, shape, device=device)
        return tokens, torch.randint(0, VOCAB_SIZE, shape, device=device)
    fn = load("batch", own.batch)
    out = _call(
        fn,
        batch_size=batch_size,
        context_length=context_length,
        vocab_size=VOCAB_SIZE,
        device=device,
    )
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise OwnModelError("batch", own.batch, "a builder returning (inputs, targets)")
    return tuple(out)


def logits_of(net, inputs) -> torch.Tensor:
    """The model's logits: `net` called on a tensor, `**` a mapping, `*` a tuple; an output
    with `.logits` (HuggingFace) or a tuple gives its logits, its first item."""
    if isinstance(inputs, dict):
        out = net(**inputs)
    elif isinstance(inputs, tuple | list):
        out = net(*inputs)
    else:
        out = net(inputs)
    if hasattr(out, "logits"):
        return out.logits
    return out[0] if isinstance(out, tuple | list) else out


def loss_of(net, inputs, targets) -> torch.Tensor:
    logits = logits_of(net, inputs)
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


@functools.cache
def describe(own: OwnModel, context_length: int, batch_size: int) -> dict:
    """What the rows say of the model: `params`, `flops_source` and each mode's FLOPs of one
    step (`flops`: mode -> FLOPs): counted on the meta device (nothing allocated, nothing
    computed: one forward, then one forward and backward), or the declared forward FLOPs per
    token times the tokens and the mode's multiplier (a backward twice a forward)."""
    with torch.device("meta"):
        model = build(own, context_length)
        inputs, targets = make_batch(own, batch_size, context_length, "meta")
    params = sum(p.numel() for p in model.parameters())
    tokens = batch_size * context_length
    if own.flops_per_token is not None:
        flops = {m: own.flops_per_token * tokens * k for m, k in MODE_MULTIPLIER.items()}
        return {"params": params, "flops_source": "declared", "flops": flops}
    with FlopCounterMode(display=False) as fwd:
        loss_of(model, inputs, targets)
    with FlopCounterMode(display=False) as both:
        loss_of(model, inputs, targets).backward()
    f, fb = float(fwd.get_total_flops()), float(both.get_total_flops())
    flops = {"forward": f, "forward_backward": fb, "train_step": fb}
    return {"params": params, "flops_source": "counted", "flops": flops}


def repeated_blocks(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """(name, list) of the module's repeated blocks: its largest nn.ModuleList by parameters
    (HuggingFace's `transformer.h`, `model.layers`; the course's `layers`), or None."""
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    lists = [(n, m) for n, m in lists if len(m) and any(True for _ in m.parameters())]
    if not lists:
        return None
    return max(lists, key=lambda nm: sum(p.numel() for p in nm[1].parameters()))


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


def _with_first(out, x):
    """`out` with its hidden state (itself, or its first item) replaced by `x`."""
    return (x, *out[1:]) if isinstance(out, tuple | list) else x


def feeds_in_order(model: torch.nn.Module, blocks, inputs) -> bool:
    """Whether one forward (no gradients) calls each block once, in order, each on the hidden
    state the one before returned: then a segment of blocks can run as one."""
    seen: list[tuple[int, object, object]] = []
    hooks = [
        b.register_forward_hook(
            lambda mod, args, out, i=i: seen.append((i, args[0] if args else None, _first(out)))
        )
        for i, b in enumerate(blocks)
    ]
    try:
        with torch.no_grad():
            logits_of(model, inputs)
    finally:
        for h in hooks:
            h.remove()
    if [i for i, _, _ in seen] != list(range(len(blocks))):
        return False
    return all(b[1] is a[2] for a, b in zip(seen, seen[1:]))


def checkpoint_segments(blocks, sizes) -> None:
    """Checkpoint consecutive segments of `blocks` (`sizes`: blocks per segment): a segment's
    first block runs the whole segment under one checkpoint call (its hidden state threaded
    through, the others called with the same further arguments), the rest pass their input
    on. Needs blocks that feed each other (`feeds_in_order`); `restore_blocks` undoes it."""
    from torch.utils.checkpoint import checkpoint

    start = 0
    for size in sizes:
        seg, last = list(blocks[start : start + size]), {}

        def run(x, *args, _seg=seg, **kwargs):
            out = _seg[0]._own_forward(x, *args, **kwargs)
            for block in _seg[1:]:
                out = block._own_forward(_first(out), *args, **kwargs)
            return out

        def head(x, *args, _run=run, _last=last, **kwargs):
            _last["out"] = checkpoint(_run, x, *args, use_reentrant=False, **kwargs)
            return _last["out"]

        def passes(x, *args, _last=last, **kwargs):  # the output's form, the hidden passed on
            return _with_first(_last["out"], x)

        for i, block in enumerate(seg):
            block._own_forward = block.__dict__.get("_own_forward", block.forward)
            block.forward = head if i == 0 else passes
        start += size


def restore_blocks(blocks) -> None:
    for block in blocks:
        if "_own_forward" in block.__dict__:
            block.forward = block.__dict__.pop("_own_forward")


def problems(spec: dict) -> list[dict]:
    """Each problem of the factories as {key, value, allowed}: the model built on the meta
    device at a short context, its batch drawn and one forward run there."""
    own = OwnModel(**spec)
    try:
        with torch.device("meta"):
            model = build(own, 16)
            inputs, targets = make_batch(own, 2, 16, "meta")
        loss_of(model, inputs, targets)
    except OwnModelError as exc:
        return [{"key": exc.key, "value": exc.value, "allowed": exc.allowed}]
    except Exception as exc:  # noqa: BLE001
        allowed = (
            f"a model mapping token ids (B, T) to logits (B, T, V) ({type(exc).__name__}: {exc})"
        )
        return [{"key": "factory", "value": own.factory, "allowed": allowed}]
    return []


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["check"] or len(argv) != 2:
        raise SystemExit("usage: python -m cs336_systems.core.own_model check JSON")
    sys.stdout.write(json.dumps(problems(json.loads(argv[1]))) + "\n")


if __name__ == "__main__":
    main()
