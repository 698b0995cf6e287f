"""Fully sharded data parallel: each rank keeps a slice of the weights and gathers a unit's full
weights only while the unit runs.

``FSDP(module, compute_dtype=None, units="block")`` groups the parameters into *units*
(parallel/fsdp_units.py): by default each child of an ``nn.ModuleList`` (a TransformerBlock)
is one unit whose parameters, norm gains too, live in one flat buffer, and every other layer
holding a 2-D ``weight`` (embedding, LM head) is a unit of that weight; ``units="layer"`` makes
every such layer (each Linear of a block) a unit of its weight alone. Each rank keeps one flat
slice of ``ceil(numel / W)`` elements of every unit (the last rank's padded with zeros) in the
parameters' own dtype (the fp32 master). Every parameter outside the units (a final norm's gain,
a bias outside the blocks) stays replicated and its gradient is averaged with an all-reduce that
starts as soon as backward has accumulated it.

The training loop is DDP's::

    fsdp = FSDP(model, compute_dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(fsdp.parameters())    # the local shards and replicated params
    loss_fn(fsdp(x), y).backward()
    fsdp.finish_gradient_synchronization()               # every local param has its fp32 grad
    optimizer.step(); optimizer.zero_grad()

One forward call of a unit (a *use*) all-gathers its flat buffer with one collective (cast to
`compute_dtype` before the gather, halving the bytes for bf16/fp16), runs the unit with its
weights as views of it (its floating inputs cast to `compute_dtype`) and frees it. The gathers
are prefetched in the order the previous forward ran the units (the registration order the
first time), bounded by `window` (default 2): the gather for the i-th use starts only once use
i - window has finished, so at most `window` units are resident (more only where units nest).
Backward mirrors it, in the order the previous backward asked for gathers: a use whose gathered
weights autograd saved (a Linear's, for the input gradient; an embedding lookup saves none) is
gathered again into the same storage before its backward; a use inside an activation
checkpoint (torch.utils.checkpoint, non-reentrant) saved nothing and is gathered afresh when the
checkpoint recomputes it; either is freed once the unit's gradients are out. Each unit's
gradients are copied into one flat buffer in the reduce dtype (`compute_dtype` unless given),
divided by W and reduce-scattered with one collective as soon as autograd has produced them all;
at most `reduce_window` (default 2) of those are in flight (an older one is waited for when a
newer one starts, so backward holds a few units' gradients, not all of them);
``finish_gradient_synchronization`` waits for the rest and leaves each shard an fp32 gradient
of its own shape. Host work per step grows with the units, not the parameters.

``.module`` is the wrapped model itself: a layer unit holds its flat local slice as ``weight``,
a block unit as ``flat_param`` (its members are taken off their modules), so an optimizer over
``.parameters()`` updates shards and replicated params alike; ``gather_full_params()`` returns
every parameter at its full size, keyed by the model's names. Tied weights (one parameter in two
layers) are one shard whose uses are gathered and reduced separately; frozen weights are
gathered (forward, and backward when their input needs a gradient) but never reduced. A
replicated parameter that requires grad but gets none in a step keeps ``grad=None`` (as in DDP,
every rank must leave the same parameters unused).

Limits: call the model through the wrapper (``fsdp(x)``); a unit's weights exist only inside
its forward (code that reads them from outside sees the flat shard or nothing); torch.compile a
unit's ``forward`` (not ``Module.compile()``, whose compiled call would trace these hooks).
Every collective goes through ``parallel.collectives``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map_only

from cs336_systems.parallel import collectives
from cs336_systems.parallel.fsdp_units import (
    UNITS,
    FlatShard,
    Prefetch,
    Unit,
    Use,
    is_shardable,
    plan_units,
)
from cs336_systems.parallel.hooks import weak_hook

__all__ = ["FSDP", "UNITS", "FlatShard", "is_shardable"]


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (a checkpoint recompute)."""
    return torch._C._current_graph_task_id() != -1


def _outer_saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks are active (a checkpoint's): only the innermost pair applies,
    so FSDP must not push its own there."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


class _Unshard(torch.autograd.Function):
    """flat shard -> the unit's full weights; its backward receives their gradients (every use
    inside the unit summed) and hands them to FSDP to reduce-scatter."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, use: Use) -> tuple[torch.Tensor, ...]:
        ctx.use = use
        ctx.set_materialize_grads(False)
        return use.fulls()

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        ctx.use.fsdp._weight_grad_ready(ctx.use, grads)
        return None, None


class _AfterInputGrad(torch.autograd.Function):
    """Identity on a frozen unit's inputs: its backward runs once the unit's backward has
    produced the input gradient, i.e. when the gathered weights are no longer needed."""

    @staticmethod
    def forward(ctx, use: Use, *inputs: torch.Tensor):
        ctx.use = use
        return inputs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.use.fsdp._unit_backward_done(ctx.use)
        return (None, *grads)


class _Entry:
    """One predicted gather of a backward: the unit's module, why (`saved` or `recompute`)
    and, for a saved one, the forward use whose storage it refills."""

    __slots__ = ("module", "kind", "use")

    def __init__(self, module: nn.Module, kind: str, use: Use | None):
        self.module, self.kind, self.use = module, kind, use


class FSDP(nn.Module):
    """See the module docstring. `window`: how many units may be gathered at once;
    `reduce_dtype`: dtype of the gradient reduce-scatter (default: `compute_dtype`, else the
    parameters'); `units`: ``"block"`` (default) or ``"layer"``; `reduce_window`: how many
    reduce-scatters (each holding its unit's whole gradient) may be in flight at once."""

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        process_group: dist.ProcessGroup | None = None,
        window: int = 2,
        reduce_dtype: torch.dtype | None = None,
        units: str = "block",
        reduce_window: int = 2,
    ):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("initialize torch.distributed before wrapping a model in FSDP")
        if window < 1 or reduce_window < 1:
            raise ValueError(
                f"window and reduce_window must be >= 1, got {window}, {reduce_window}"
            )
        if units not in UNITS:
            raise ValueError(f"unknown FSDP units {units!r}; known: {UNITS}")
        self.module = module
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype or compute_dtype
        self.process_group = process_group
        self.window = window
        self.reduce_window = reduce_window
        self.peak_reduce_in_flight = 0  # most reduce-scatters not yet waited for, at once
        self.units_kind = units
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        src = 0 if process_group is None else dist.get_global_rank(process_group, 0)
        with torch.no_grad():  # every rank starts from rank 0's model
            for tensor in [*module.parameters(), *module.buffers()]:
                collectives.broadcast(tensor.data, src, group=process_group)

        self._param_names = [n for n, _ in module.named_parameters(remove_duplicate=False)]
        self.units: list[Unit] = plan_units(module, units, self.world_size, self.rank)
        self.sharded: list[FlatShard] = list({id(u.flat): u.flat for u in self.units}.values())
        self._unit_of: dict[nn.Module, Unit] = {u.module: u for u in self.units}
        flat_ids = {id(f.param) for f in self.sharded}
        self.replicated = [
            p for p in module.parameters() if id(p) not in flat_ids and p.requires_grad
        ]

        self._handles: list[Any] = []
        for unit in self.units:
            self._handles.append(
                unit.module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            )
            self._handles.append(
                unit.module.register_forward_hook(self._post_forward, always_call=True)
            )
        for p in self.replicated:
            hook = weak_hook(self._replicated_ready)
            self._handles.append(p.register_post_accumulate_grad_hook(hook))

        self._order: list[nn.Module] = [u.module for u in self.units]  # predicted forward
        self._record: list[nn.Module] = []
        self._fwd: Prefetch | None = None
        self._fwd_pos = 0
        self._saved_order: list[Use] = []  # this forward's saved uses, in forward order
        self._bwd: Prefetch | None = None
        self._bwd_pos = 0
        self._bwd_record: list[tuple[nn.Module, str]] = []
        self._prev_bwd: list[tuple[nn.Module, str]] | None = None
        self._in_backward = False
        self._active: dict[nn.Module, list[tuple[Use, Any, list[str], bool]]] = {}
        self._pending: list[tuple[FlatShard, Any, torch.Tensor]] = []
        self._pending_replicated: list[Any] = []
        self._resident: set[Use] = set()
        self._resident_bytes = 0
        self.peak_resident = 0  # most units gathered at once since reset_peak()
        self.peak_resident_bytes = 0  # and the most bytes they took
        self.gather_wait_s = 0.0  # host time spent waiting for gathers (GPU: enqueuing only)
        self.forward_gathers = len(self._order)  # all-gathers of the last forward
        self.unplanned_gathers = 0  # gathers no prefetch plan predicted, since reset_peak()

    # ---- bookkeeping ---------------------------------------------------------------------

    def _track(self, use: Use, resident: bool) -> None:
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

    @property
    def resident_bytes(self) -> int:
        """Bytes of the units gathered now."""
        return self._resident_bytes

    def resident_layers(self) -> list[str]:
        """Names of the units whose full weights are gathered now (storage allocated)."""
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
        self.unplanned_gathers = 0

    # ---- forward -------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._begin_forward()
        try:
            return self.module(*args, **kwargs)
        finally:
            self._end_forward()

    def _begin_forward(self) -> None:
        if self._fwd is not None:
            self._fwd.release()
        plan = list(self._order)
        self._fwd = Prefetch(
            plan, self.window, lambda i: Use(self, self._unit_of[plan[i]]).start_gather()
        )
        self._fwd_pos = 0
        self._record = []
        self._saved_order = []
        for unit in self.units:
            unit.saved_uses = []

    def _end_forward(self) -> None:
        if self._fwd is not None:
            self._fwd.release()  # prefetched for units that did not run
        self._fwd = None
        if self._record:
            self._order = self._record
            self.forward_gathers = len(self._record)
        if self._bwd is not None:
            self._bwd.release()
        self._bwd = self._backward_plan()  # pumped by backward's first gather
        self._bwd_pos = 0
        self._bwd_record = []

    def _backward_plan(self) -> Prefetch | None:
        """The gathers the coming backward will ask for, as the last backward asked (the saved
        uses in reverse order the first time), each saved entry bound to this forward's use."""
        stacks = {u.module: list(u.saved_uses) for u in self.units}
        if self._prev_bwd is None:
            prev = [(u.unit.module, "saved") for u in reversed(self._saved_order)]
        else:
            prev = self._prev_bwd
        plan: list[_Entry] = []
        for module, kind in prev:
            use = None
            if kind == "saved":
                if not stacks.get(module):
                    break  # this forward saved less than the last: predict no further
                use = stacks[module].pop()
            plan.append(_Entry(module, kind, use))
        if not plan:
            return None

        def start(i: int) -> Use:
            e = plan[i]
            use = e.use if e.use is not None else Use(self, self._unit_of[e.module])
            use.bwd_pos = i
            return use.start_gather()

        return Prefetch(plan, self.window, start)

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict):
        unit = self._unit_of[module]
        recompute = _in_backward()  # a checkpoint recomputing this unit inside backward
        if recompute:
            use = self._backward_use(unit, None)
        else:
            if self._fwd is None:  # the inner model was called directly
                self._begin_forward()
            assert self._fwd is not None
            pos = self._fwd_pos
            self._fwd_pos += 1
            self._record.append(module)
            fwd = self._fwd
            if pos < len(fwd.plan) and fwd.plan[pos] is module:
                use = fwd.take(pos)
                use.fwd_pos = pos
            else:  # the order differs from the prediction: no prefetch for the rest of this pass
                fwd.drain(pos)
                use = Use(self, unit).start_gather()
                self.unplanned_gathers += 1
            use.wait()
        flat = unit.flat
        grad_on = torch.is_grad_enabled()
        track = grad_on and flat.param.requires_grad
        fulls = _Unshard.apply(flat.param, use) if track else use.fulls()
        for mod, attr, i in unit.sites:
            mod.__dict__[attr] = fulls[i]
        cast: list[str] = []
        dtype = self.compute_dtype
        if dtype is not None:
            if unit.kind == "layer":  # the layer's other parameters (a bias) in compute dtype
                for name, p in module._parameters.items():
                    if name != "weight" and p is not None and p.is_floating_point():
                        module.__dict__[name] = p.to(dtype)
                        cast.append(name)
            args, kwargs = tree_map_only(
                torch.Tensor,
                lambda t: t.to(dtype) if t.is_floating_point() else t,
                (args, kwargs),
            )
        hooks = None
        if grad_on and not recompute:
            if not flat.param.requires_grad:
                args = self._wrap_inputs(use, args)
            if not _outer_saved_tensor_hooks():  # under a checkpoint nothing is saved
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
        self._active.setdefault(module, []).append((use, hooks, cast, recompute))
        return args, kwargs

    def _wrap_inputs(self, use: Use, args: tuple) -> tuple:
        idx = [i for i, a in enumerate(args) if torch.is_tensor(a) and a.requires_grad]
        if not idx:
            return args
        wrapped = _AfterInputGrad.apply(use, *(args[i] for i in idx))
        out = list(args)
        for i, w in zip(idx, wrapped, strict=True):
            out[i] = w
        return tuple(out)

    def _post_forward(self, module: nn.Module, args: tuple, output: Any):
        use, hooks, cast, recompute = self._active[module].pop()
        unit = use.unit
        if hooks is not None:
            hooks.__exit__(None, None, None)
        for mod, attr, _ in unit.sites:
            mod.__dict__.pop(attr, None)
        for name in cast:
            module.__dict__.pop(name, None)
        if recompute:  # resident until the unit's gradients are out; an older recompute of
            # this unit (a nested checkpoint's outer pass) kept nothing of it
            for old in unit.recomputed:
                self._free_backward(old)
            unit.recomputed = [use]
            return output
        if self._fwd is not None and use.fwd_pos is not None:
            self._fwd.finish(use.fwd_pos)
        else:
            use.free()
        if use.saved:
            unit.saved_uses.append(use)
            self._saved_order.append(use)
            tensors: list[torch.Tensor] = []
            tree_map_only(torch.Tensor, tensors.append, output)
            for t in tensors:
                if t.requires_grad:
                    pre = weak_hook(self._pre_backward)
                    t.register_hook(lambda grad, u=use, pre=pre: pre(u))
        return output

    # ---- backward ------------------------------------------------------------------------

    def _enter_backward(self) -> None:
        if not self._in_backward:  # the first gather of this backward: clean up after it
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _pre_backward(self, use: Use) -> None:
        if use.backward_done or use.entered_backward:
            return
        use.entered_backward = True
        self._backward_use(use.unit, use)
        # the weights back on their modules while the unit's backward runs: a checkpoint inside
        # the unit (an FFN half) recomputes through them (its gradient flows through the
        # forward's graph; these only give the recompute its values)
        for (mod, attr, _), full in zip(use.unit.sites, self._site_tensors(use), strict=True):
            mod.__dict__[attr] = full

    def _site_tensors(self, use: Use) -> list[torch.Tensor]:
        # requiring grad as in forward, so that a recompute saves what the forward saved
        grad = use.unit.flat.param.requires_grad
        fulls = [t.requires_grad_(grad) for t in use.fulls()]
        return [fulls[i] for _, _, i in use.unit.sites]

    def _backward_use(self, unit: Unit, use: Use | None) -> Use:
        """The gathered weights for a saved use (`use`) or a recompute (None), from the
        backward plan where it predicted this gather, else gathered now."""
        self._enter_backward()
        kind = "recompute" if use is None else "saved"
        self._bwd_record.append((unit.module, kind))
        pos = self._bwd_pos
        self._bwd_pos += 1
        bwd = self._bwd
        got = None
        if bwd is not None and pos < len(bwd.plan):
            e = bwd.plan[pos]
            if e.module is unit.module and e.kind == kind and (use is None or e.use is use):
                got = bwd.take(pos)
        if got is None:
            if bwd is not None:
                bwd.drain(pos)
            got = use if use is not None else Use(self, unit)
            got.bwd_pos = None
            if not got.resident:
                got.start_gather()
                self.unplanned_gathers += 1
        got.wait()
        return got

    def _free_backward(self, use: Use) -> None:
        if self._bwd is not None and use.bwd_pos is not None:
            self._bwd.finish(use.bwd_pos)
        else:
            use.free()

    def _unit_backward_done(self, use: Use) -> None:
        """A forward use's gradients are out: free what was gathered for its backward."""
        if use.backward_done:
            return
        use.backward_done = True
        unit = use.unit
        if use.saved:
            if use.entered_backward:
                for mod, attr, _ in unit.sites:
                    mod.__dict__.pop(attr, None)
            self._free_backward(use)
        elif unit.recomputed:
            self._free_backward(unit.recomputed.pop())

    def _weight_grad_ready(self, use: Use, grads: tuple[torch.Tensor | None, ...]) -> None:
        flat = use.unit.flat
        dtype = self.reduce_dtype or flat.param.dtype
        s = flat.shard_numel
        ref = next(g for g in grads if g is not None)
        send = torch.empty(self.world_size * s, dtype=dtype, device=ref.device)
        covered = 0
        for m, g in zip(flat.members, grads, strict=True):
            if m.offset > covered:
                send[covered : m.offset].zero_()
            part = send[m.offset : m.offset + m.numel]
            part.copy_(g.reshape(-1)) if g is not None else part.zero_()
            covered = m.offset + m.numel
        send[covered:].zero_()
        send.div_(self.world_size)
        out = torch.empty(s, dtype=dtype, device=ref.device)
        work = collectives.reduce_scatter_tensor(out, send, group=self.process_group, async_op=True)
        self._pending.append((flat, work, out))
        self._unit_backward_done(use)
        # each reduce-scatter's input, the unit's whole gradient, lives until the collective is
        # waited for: wait for all but the last `reduce_window` now (on NCCL this only orders
        # the streams), so backward holds a few units' gradients, not every unit's
        while len(self._pending) > self.reduce_window:
            self._land(*self._pending.pop(0))
        self.peak_reduce_in_flight = max(self.peak_reduce_in_flight, len(self._pending))

    def _end_backward(self) -> None:
        if self._bwd is not None:
            self._bwd.release()
        self._bwd = None
        for unit in self.units:  # what a checkpoint recomputed but no gradient released
            for use in unit.recomputed:
                use.free()
            unit.recomputed = []
        if self._bwd_record:
            self._prev_bwd = self._bwd_record
        self._bwd_record = []
        self._in_backward = False

    def _replicated_ready(self, p: nn.Parameter) -> None:
        p.grad.div_(self.world_size)
        self._pending_replicated.append(
            collectives.all_reduce(p.grad, group=self.process_group, async_op=True)
        )

    @staticmethod
    def _land(flat: FlatShard, work: Any, out: torch.Tensor) -> None:
        """Wait for one reduce-scatter and add its slice to the shard's fp32 gradient."""
        work.wait()
        grad = out.to(flat.param.dtype)
        if flat.param.grad is None:
            flat.param.grad = grad
        else:
            flat.param.grad.add_(grad)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every gradient collective; each shard then holds its fp32 gradient."""
        for flat, work, out in self._pending:
            self._land(flat, work, out)
        for work in self._pending_replicated:
            work.wait()
        self._pending.clear()
        self._pending_replicated.clear()
        if self._in_backward:  # (the queued callback has run by now; this is a safety net)
            self._end_backward()

    # ---- full parameters -----------------------------------------------------------------

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} for every parameter, by the wrapped model's own names (tied ones
        under each of their names): sharded ones gathered, replicated ones as they are."""
        full: dict[str, torch.Tensor] = {}
        for flat in self.sharded:
            out = torch.empty(
                self.world_size * flat.shard_numel, dtype=flat.param.dtype, device=flat.param.device
            )
            collectives.all_gather_into_tensor(out, flat.param.detach(), group=self.process_group)
            for m in flat.members:
                t = out[m.offset : m.offset + m.numel].view(m.shape)
                for name in m.names:
                    full[name] = t
        live = dict(self.module.named_parameters(remove_duplicate=False))
        return {n: full[n] if n in full else live[n].detach() for n in self._param_names}

    def remove_hooks(self) -> None:
        """Detach this wrapper's hooks (the model keeps its shards)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
