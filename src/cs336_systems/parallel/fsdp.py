"""Fully sharded data parallel: each rank keeps a slice of every large weight and gathers the
full weight only while a layer runs.

``FSDP(module, compute_dtype=None)`` shards the weight of every layer that holds a 2-D
``weight`` parameter (a linear map, (d_out, d_in), or a lookup table, (vocab, d_model): torch's
``nn.Linear``/``nn.Embedding`` or a model's own classes alike): each rank keeps one flat slice of
``ceil(numel / W)`` elements of it (the last rank's padded with zeros), in the parameter's own
dtype (the fp32 master). Every other parameter (norm gains, biases) stays replicated and its
gradient is averaged with an all-reduce that starts as soon as backward has accumulated it.

The training loop is DDP's::

    fsdp = FSDP(model, compute_dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(fsdp.parameters())    # the local shards and replicated params
    loss_fn(fsdp(x), y).backward()
    fsdp.finish_gradient_synchronization()               # every local param has its fp32 grad
    optimizer.step(); optimizer.zero_grad()

One forward call of a sharded layer (a *use*) all-gathers its weight (cast to `compute_dtype`
before the gather, halving the bytes for bf16/fp16), runs the layer with it and frees it. The
gathers are prefetched in the order the previous forward ran the layers (the registration order
the first time), bounded by `window` (default 2): the gather for the i-th use starts only once
use i - window has finished, so at most `window` full weights are resident (more only where
layers nest). Backward mirrors it: the uses whose gathered weight autograd saved (a Linear's,
for the input gradient; an embedding lookup saves none) are gathered again in reverse order
under the same bound and freed once their backward is done. Each weight gradient is cast to the
reduce dtype (`compute_dtype` unless given), divided by W and reduce-scattered asynchronously as
soon as autograd has produced it; ``finish_gradient_synchronization`` waits for every
collective and leaves each shard an fp32 gradient of its own shape.

``.module`` is the wrapped model itself, whose sharded layers now hold their flat local slice as
``weight`` (so an optimizer over ``.parameters()`` updates shards and replicated params alike);
``gather_full_params()`` returns every parameter at its full size, keyed by the model's names.
Tied weights (one parameter in two layers) are one shard whose two uses are gathered and reduced
separately; frozen weights are gathered (forward, and backward when their input needs a
gradient) but never reduced. A replicated parameter that requires grad but gets none in a step
keeps ``grad=None`` (as in DDP, every rank must leave the same parameters unused).

Limits: call the model through the wrapper (``fsdp(x)``); a layer's weight is full only inside
that layer's forward (code that reads ``layer.weight`` from outside sees the flat shard); not
combined with activation checkpointing. Every collective goes through ``parallel.collectives``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map_only

from cs336_systems.parallel import collectives


def is_shardable(module: nn.Module) -> bool:
    """A layer FSDP shards: it holds (directly) a 2-D `weight` parameter."""
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 2


class ShardedParameter:
    """One sharded weight: its full shape and this rank's padded flat slice (`param`)."""

    def __init__(self, param: nn.Parameter, names: list[str], world: int, rank: int):
        self.shape = tuple(param.shape)
        self.numel = param.numel()
        self.names = names
        self.shard_numel = math.ceil(self.numel / world)
        lo = min(rank * self.shard_numel, self.numel)
        hi = min(lo + self.shard_numel, self.numel)
        local = torch.zeros(self.shard_numel, dtype=param.dtype, device=param.device)
        with torch.no_grad():
            local[: hi - lo].copy_(param.detach().reshape(-1)[lo:hi])
        self.param = nn.Parameter(local, requires_grad=param.requires_grad)
        self.valid = hi - lo  # elements of the shard that are not padding


class _Use:
    """One forward call of a sharded layer: its gathered weight from gather to free, in forward
    and (gathered again into the same storage) in backward."""

    def __init__(self, fsdp: FSDP, module: nn.Module, sp: ShardedParameter):
        self.fsdp, self.module, self.sp = fsdp, module, sp
        self.buffer: torch.Tensor | None = None  # W * shard_numel elements, compute dtype
        self.work: Any = None
        self.saved = False  # autograd saved the gathered weight: backward needs it again
        self.resident = False
        self.backward_done = False
        self.entered_backward = False
        self.fwd_pos: int | None = None  # its entry in the forward prefetch plan

    @property
    def label(self) -> str:
        return self.fsdp._module_names.get(self.module, "?")

    def start_gather(self) -> _Use:
        f = self.fsdp
        shard = self.sp.param.detach()
        send = shard if f.compute_dtype in (None, shard.dtype) else shard.to(f.compute_dtype)
        n = f.world_size * self.sp.shard_numel
        if self.buffer is None:
            self.buffer = torch.empty(n, dtype=send.dtype, device=send.device)
        else:  # the second gather of this use writes into the storage autograd saved
            self.buffer.untyped_storage().resize_(n * send.element_size())
        self.work = collectives.all_gather_into_tensor(
            self.buffer, send, group=f.process_group, async_op=True
        )
        f._track(self, resident=True)
        return self

    def wait(self) -> None:
        if self.work is not None:
            t0 = time.perf_counter()
            self.work.wait()
            self.fsdp.gather_wait_s += time.perf_counter() - t0
            self.work = None

    def free(self) -> None:
        if self.resident:
            self.wait()
            self.buffer.untyped_storage().resize_(0)
            self.fsdp._track(self, resident=False)

    def full(self) -> torch.Tensor:
        """The full weight: a tensor over the gathered storage (not a view of the buffer, so
        that freeing the storage frees it and a second gather refills what autograd saved)."""
        b = self.buffer
        return torch.empty(0, dtype=b.dtype, device=b.device).set_(
            b.untyped_storage(), 0, self.sp.shape
        )


class _Prefetch:
    """Gathers for a predicted sequence of uses, at most `window` ahead: entry i starts only
    once entry i - window has finished (an entry needed earlier starts on demand)."""

    def __init__(self, plan: list, window: int, start: Callable[[int], _Use]):
        self.plan, self.window, self.start = plan, window, start
        self.uses: dict[int, _Use] = {}
        self.finished: set[int] = set()
        self.next = 0

    def pump(self) -> None:
        while self.next < len(self.plan):
            i = self.next
            if i not in self.uses:
                if i >= self.window and i - self.window not in self.finished:
                    return
                self.uses[i] = self.start(i)
            self.next += 1

    def take(self, i: int) -> _Use:
        if i not in self.uses:
            self.uses[i] = self.start(i)
        self.pump()
        return self.uses[i]

    def finish(self, i: int) -> None:
        if i in self.uses and i not in self.finished:
            self.uses[i].free()
            self.finished.add(i)
            self.pump()

    def drain(self) -> None:
        """Free every gathered weight of this sequence (the prediction ended or was wrong)."""
        for i, use in self.uses.items():
            if i not in self.finished:
                use.free()
        self.plan = self.plan[: self.next]


class _Unshard(torch.autograd.Function):
    """shard -> full weight; its backward receives the weight's whole gradient (all uses inside
    the layer summed) and hands it to FSDP to reduce-scatter."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, use: _Use) -> torch.Tensor:
        ctx.use = use
        return use.full()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.use.fsdp._weight_grad_ready(ctx.use, grad)
        return None, None


class _AfterInputGrad(torch.autograd.Function):
    """Identity on a frozen layer's inputs: its backward runs once the layer's backward has
    produced the input gradient, i.e. when the gathered weight is no longer needed."""

    @staticmethod
    def forward(ctx, use: _Use, *inputs: torch.Tensor):
        ctx.use = use
        return inputs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.use.fsdp._backward_done(ctx.use)
        return (None, *grads)


class FSDP(nn.Module):
    """See the module docstring. `window`: how many full weights may be gathered at once;
    `reduce_dtype`: dtype of the gradient reduce-scatter (default: `compute_dtype`, else the
    parameter's)."""

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        process_group: dist.ProcessGroup | None = None,
        window: int = 2,
        reduce_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialize torch.distributed before wrapping a model in FSDP")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.module = module
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype or compute_dtype
        self.process_group = process_group
        self.window = window
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        with torch.no_grad():  # every rank starts from rank 0's model
            for tensor in [*module.parameters(), *module.buffers()]:
                collectives.broadcast(tensor.data, src, group=process_group)

        names: dict[int, list[str]] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        self._module_names = {m: n for n, m in module.named_modules(remove_duplicate=False)}
        self.sharded: list[ShardedParameter] = []
        self._site: dict[nn.Module, ShardedParameter] = {}  # layer -> its sharded weight
        by_param: dict[int, ShardedParameter] = {}
        for layer in module.modules():
            if not is_shardable(layer):
                continue
            weight = layer._parameters["weight"]
            if id(weight) not in by_param:
                sp = ShardedParameter(weight, names[id(weight)], self.world_size, self.rank)
                by_param[id(weight)] = sp
                self.sharded.append(sp)
            self._site[layer] = by_param[id(weight)]
        for layer, sp in self._site.items():
            layer._parameters["weight"] = sp.param  # the full weight is freed with the last ref
        shard_ids = {id(sp.param) for sp in self.sharded}
        self.replicated = [
            p for p in module.parameters() if id(p) not in shard_ids and p.requires_grad
        ]

        self._handles: list[Any] = []
        for layer in self._site:
            self._handles.append(
                layer.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            )
            self._handles.append(layer.register_forward_hook(self._post_forward, always_call=True))
        for p in self.replicated:
            self._handles.append(p.register_post_accumulate_grad_hook(self._replicated_ready))

        self._order: list[nn.Module] = list(self._site)  # predicted forward order of the uses
        self._record: list[nn.Module] = []
        self._fwd: _Prefetch | None = None
        self._fwd_pos = 0
        self._bwd: _Prefetch | None = None
        self._bwd_index: dict[_Use, int] = {}
        self._in_backward = False
        self._active: dict[nn.Module, list[tuple[_Use, Any, list[str]]]] = {}
        self._saved_uses: list[_Use] = []
        self._pending: list[tuple[ShardedParameter, Any, torch.Tensor]] = []
        self._pending_replicated: list[Any] = []
        self._resident: set[_Use] = set()
        self._resident_bytes = 0
        self.peak_resident = 0  # most full weights gathered at once since reset_peak()
        self.peak_resident_bytes = 0  # and the most bytes they took
        self.gather_wait_s = 0.0  # host time spent waiting for gathers (GPU: enqueuing only)
        self.forward_gathers = len(self._order)  # all-gathers of the last forward

    # ---- bookkeeping ---------------------------------------------------------------------

    def _track(self, use: _Use, resident: bool) -> None:
        use.resident = resident
        nbytes = use.buffer.numel() * use.buffer.element_size()
        if resident:
            self._resident.add(use)
            self._resident_bytes += nbytes
            self.peak_resident = max(self.peak_resident, len(self._resident))
            self.peak_resident_bytes = max(self.peak_resident_bytes, self._resident_bytes)
        else:
            self._resident.discard(use)
            self._resident_bytes -= nbytes

    def resident_layers(self) -> list[str]:
        """Names of the layers whose full weight is gathered now (storage allocated)."""
        return sorted(
            u.label
            for u in self._resident
            if u.buffer is not None and u.buffer.untyped_storage().nbytes() > 0
        )

    def reset_peak(self) -> None:
        """Restart the peaks (`peak_resident`, `peak_resident_bytes`) and `gather_wait_s`."""
        self.peak_resident = len(self._resident)
        self.peak_resident_bytes = self._resident_bytes
        self.gather_wait_s = 0.0

    # ---- forward -------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._begin_forward()
        try:
            return self.module(*args, **kwargs)
        finally:
            self._end_forward()

    def _begin_forward(self) -> None:
        if self._fwd is not None:
            self._fwd.drain()
        plan = list(self._order)
        self._fwd = _Prefetch(plan, self.window, lambda i: self._new_use(plan[i]).start_gather())
        self._fwd_pos = 0
        self._record = []
        self._saved_uses = []

    def _new_use(self, layer: nn.Module) -> _Use:
        return _Use(self, layer, self._site[layer])

    def _end_forward(self) -> None:
        if self._fwd is not None:
            self._fwd.drain()  # prefetched for layers that did not run
        self._fwd = None
        if self._record:
            self._order = self._record
            self.forward_gathers = len(self._record)
        if self._saved_uses:  # backward gathers them again, last used first
            plan = list(reversed(self._saved_uses))
            self._bwd = _Prefetch(plan, self.window, lambda i: plan[i].start_gather())
            self._bwd_index = {u: i for i, u in enumerate(plan)}

    def _pre_forward(self, layer: nn.Module, args: tuple, kwargs: dict):
        if self._fwd is None:  # the inner model was called directly
            self._begin_forward()
        assert self._fwd is not None
        pos = self._fwd_pos
        self._fwd_pos += 1
        self._record.append(layer)
        fwd = self._fwd
        if pos < len(fwd.plan) and fwd.plan[pos] is layer:
            use = fwd.take(pos)
            use.fwd_pos = pos
        else:  # the order differs from the prediction: no prefetch for the rest of this pass
            fwd.drain()
            use = self._new_use(layer).start_gather()
        use.wait()
        sp = self._site[layer]
        grad_on = torch.is_grad_enabled()
        track = grad_on and sp.param.requires_grad
        layer.__dict__["weight"] = _Unshard.apply(sp.param, use) if track else use.full()
        cast: list[str] = []
        dtype = self.compute_dtype
        if dtype is not None:
            for name, p in layer._parameters.items():
                if name != "weight" and p is not None and p.is_floating_point():
                    layer.__dict__[name] = p.to(dtype)
                    cast.append(name)
            args, kwargs = tree_map_only(
                torch.Tensor,
                lambda t: t.to(dtype) if t.is_floating_point() else t,
                (args, kwargs),
            )
        hooks = None
        if grad_on:
            if not sp.param.requires_grad:
                args = self._wrap_inputs(use, args)
            storage = use.buffer.untyped_storage().data_ptr()

            def pack(t: torch.Tensor) -> torch.Tensor:
                try:
                    if t.untyped_storage().data_ptr() == storage:
                        use.saved = True
                except (RuntimeError, NotImplementedError):
                    pass
                return t

            hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            hooks.__enter__()
        self._active.setdefault(layer, []).append((use, hooks, cast))
        return args, kwargs

    def _wrap_inputs(self, use: _Use, args: tuple) -> tuple:
        idx = [i for i, a in enumerate(args) if torch.is_tensor(a) and a.requires_grad]
        if not idx:
            return args
        wrapped = _AfterInputGrad.apply(use, *(args[i] for i in idx))
        out = list(args)
        for i, w in zip(idx, wrapped, strict=True):
            out[i] = w
        return tuple(out)

    def _post_forward(self, layer: nn.Module, args: tuple, output: Any):
        use, hooks, cast = self._active[layer].pop()
        if hooks is not None:
            hooks.__exit__(None, None, None)
        for name in ["weight", *cast]:
            layer.__dict__.pop(name, None)
        if self._fwd is not None and use.fwd_pos is not None:
            self._fwd.finish(use.fwd_pos)
        else:
            use.free()
        if use.saved:
            self._saved_uses.append(use)
            tensors: list[torch.Tensor] = []
            tree_map_only(torch.Tensor, tensors.append, output)
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(lambda grad, u=use: self._pre_backward(u))
        return output

    # ---- backward ------------------------------------------------------------------------

    def _pre_backward(self, use: _Use) -> None:
        if use.backward_done or use.entered_backward:
            return
        use.entered_backward = True
        if not self._in_backward:  # the first layer of this backward: clean up after it
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        if self._bwd is not None and use in self._bwd_index:
            self._bwd.take(self._bwd_index[use])
        elif not use.resident:
            use.start_gather()
        use.wait()

    def _backward_done(self, use: _Use) -> None:
        if use.backward_done:
            return
        use.backward_done = True
        if self._bwd is not None and use in self._bwd_index:
            self._bwd.finish(self._bwd_index[use])
        else:
            use.free()

    def _weight_grad_ready(self, use: _Use, grad: torch.Tensor) -> None:
        sp = use.sp
        dtype = self.reduce_dtype or sp.param.dtype
        n, s = sp.numel, sp.shard_numel
        send = torch.empty(self.world_size * s, dtype=dtype, device=grad.device)
        send[:n].copy_(grad.reshape(-1))
        send[n:].zero_()
        send.div_(self.world_size)
        out = torch.empty(s, dtype=dtype, device=grad.device)
        work = collectives.reduce_scatter_tensor(out, send, group=self.process_group, async_op=True)
        self._pending.append((sp, work, out))
        self._backward_done(use)

    def _end_backward(self) -> None:
        if self._bwd is not None:
            self._bwd.drain()
        self._bwd = None
        self._bwd_index = {}
        self._in_backward = False

    def _replicated_ready(self, p: nn.Parameter) -> None:
        p.grad.div_(self.world_size)
        self._pending_replicated.append(
            collectives.all_reduce(p.grad, group=self.process_group, async_op=True)
        )

    def finish_gradient_synchronization(self) -> None:
        """Wait for every gradient collective; each shard then holds its fp32 gradient."""
        for sp, work, out in self._pending:
            work.wait()
            grad = out.to(sp.param.dtype)
            if sp.param.grad is None:
                sp.param.grad = grad
            else:
                sp.param.grad.add_(grad)
        for work in self._pending_replicated:
            work.wait()
        self._pending.clear()
        self._pending_replicated.clear()
        self._end_backward()

    # ---- full parameters -----------------------------------------------------------------

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} for every parameter, by the wrapped model's own names (tied ones
        under each of their names): sharded ones gathered, replicated ones as they are."""
        full: dict[int, torch.Tensor] = {}
        for sp in self.sharded:
            out = torch.empty(
                self.world_size * sp.shard_numel, dtype=sp.param.dtype, device=sp.param.device
            )
            collectives.all_gather_into_tensor(out, sp.param.detach(), group=self.process_group)
            full[id(sp.param)] = out[: sp.numel].view(sp.shape)
        return {
            name: full.get(id(p), p.detach())
            for name, p in self.module.named_parameters(remove_duplicate=False)
        }

    def remove_hooks(self) -> None:
        """Detach this wrapper's hooks (the model keeps its shards)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
