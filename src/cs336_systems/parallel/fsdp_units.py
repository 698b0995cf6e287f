"""FSDP's pieces below the wrapper: which parameters form a unit, their flat shard, one gathered
use of it and the bounded prefetch of a predicted sequence of uses (parallel/fsdp.py).

A *unit* is a module whose parameters FSDP gathers together (one all-gather per use, one
reduce-scatter per use in backward). `plan_units(model, "block")` makes each child of a
`nn.ModuleList` a unit (a TransformerBlock: all its parameters, norm gains too, in one flat
buffer) and every other layer with a 2-D ``weight`` (embedding, LM head) a unit of that weight
alone; `"layer"` makes every such layer a unit of its weight, the rest replicated. A parameter
used outside its block (tied), frozen, or of another dtype than the block's leaves the block's
flat buffer and is handled per layer (2-D weights) or replicated.

A `FlatShard` holds its members back to back in one flat vector, each starting at a multiple of
`ALIGN` elements (so every gathered weight is 128-byte aligned for bf16; a one-member shard has
no gap), zero-padded to `W * shard_numel`; rank r keeps elements [r * shard_numel, (r + 1) *
shard_numel) as an fp32 (the parameters' dtype) `nn.Parameter`, the one the optimizer updates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cs336_systems.parallel import collectives

UNITS = ("block", "layer")
ALIGN = 64  # elements: 128 bytes of bf16


def is_shardable(module: nn.Module) -> bool:
    """A layer FSDP shards on its own: it holds (directly) a 2-D `weight` parameter."""
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 2


@dataclass
class Member:
    """One parameter inside a flat shard: where it starts in the full flat vector, its shape,
    and every (module, attribute) that uses it, with its names in the model."""

    shape: tuple[int, ...]
    offset: int
    names: list[str]
    sites: list[tuple[nn.Module, str]]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class FlatShard:
    """Members' full values laid out flat (module doc); this rank's slice as `param`."""

    def __init__(self, params: list[tuple[nn.Parameter, Member]], world: int, rank: int):
        offset = 0
        for i, (_, m) in enumerate(params):
            if i:
                offset = -(-offset // ALIGN) * ALIGN
            m.offset = offset
            offset += m.numel
        self.members = [m for _, m in params]
        self.numel = offset  # the full flat length, alignment gaps included
        self.shard_numel = math.ceil(offset / world)
        lo = min(rank * self.shard_numel, self.numel)
        hi = min(lo + self.shard_numel, self.numel)
        first = params[0][0]
        local = torch.zeros(self.shard_numel, dtype=first.dtype, device=first.device)
        with torch.no_grad():
            for p, m in params:  # each member's part that falls in [lo, hi)
                a, b = max(lo, m.offset), min(hi, m.offset + m.numel)
                if a < b:
                    local[a - lo : b - lo].copy_(
                        p.detach().reshape(-1)[a - m.offset : b - m.offset]
                    )
        self.param = nn.Parameter(local, requires_grad=first.requires_grad)
        self.valid = hi - lo  # elements of the shard inside the full vector (not padding)

    @property
    def shape(self) -> tuple[int, ...]:
        """The single member's shape (layer units)."""
        return self.members[0].shape

    @property
    def names(self) -> list[str]:
        return [n for m in self.members for n in m.names]


@dataclass
class Unit:
    """A module FSDP gathers around: its flat shard and the module the hooks sit on."""

    module: nn.Module
    flat: FlatShard
    label: str
    kind: str  # "block" | "layer"
    sites: list = field(default_factory=list)  # (module, attribute, member index) to fill
    saved_uses: list = field(default_factory=list)  # forward uses backward gathers again
    recomputed: list = field(default_factory=list)  # uses gathered for a checkpoint recompute


def _param_sites(model: nn.Module) -> dict[int, list[tuple[str, nn.Module, str]]]:
    """id(param) -> every (qualified name, owning module, attribute) that holds it."""
    sites: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, p in mod._parameters.items():
            if p is not None:
                name = f"{mod_name}.{attr}" if mod_name else attr
                sites.setdefault(id(p), []).append((name, mod, attr))
    return sites


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each child of a ModuleList, outermost lists only."""
    out: list[tuple[str, nn.Module]] = []
    taken: list[str] = []
    for name, mod in model.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        if isinstance(mod, nn.ModuleList):
            for i, child in enumerate(mod):
                if any(p is not None for p in child.parameters()):
                    child_name = f"{name}.{i}" if name else str(i)
                    out.append((child_name, child))
                    taken.append(child_name)
    return out


def plan_units(model: nn.Module, units: str, world: int, rank: int) -> list[Unit]:
    """The units of `model` (module doc), each with its FlatShard; the members' parameters are
    taken off their modules (a layer unit's weight is replaced by the flat shard, a block's
    members are removed and its flat shard registered as ``flat_param``)."""
    if units not in UNITS:
        raise ValueError(f"unknown FSDP units {units!r}; known: {UNITS}")
    sites = _param_sites(model)
    out: list[Unit] = []
    claimed: set[int] = set()
    if units == "block":
        for bname, block in blocks(model):
            inside = {id(m) for m in block.modules()}
            params = [p for p in block.parameters() if p.requires_grad and p.is_floating_point()]
            if not params:
                continue
            dtype = max({p.dtype for p in params}, key=[p.dtype for p in params].count)
            members = []
            for p in params:
                where = sites[id(p)]
                if p.dtype != dtype or any(id(mod) not in inside for _, mod, _ in where):
                    continue  # tied outside the block, or another dtype: per layer
                m = Member(
                    tuple(p.shape), 0, [n for n, _, _ in where], [(mod, a) for _, mod, a in where]
                )
                members.append((p, m))
            if not members:
                continue
            flat = FlatShard(members, world, rank)
            for p, m in members:
                claimed.add(id(p))
                for mod, attr in m.sites:
                    del mod._parameters[attr]
            block.register_parameter("flat_param", flat.param)
            sites_ = [(mod, a, i) for i, m in enumerate(flat.members) for mod, a in m.sites]
            out.append(Unit(block, flat, bname, "block", sites_))
    by_param: dict[int, FlatShard] = {}
    names = {m: n for n, m in model.named_modules(remove_duplicate=False)}
    for layer in model.modules():
        if not is_shardable(layer) or id(layer._parameters["weight"]) in claimed:
            continue
        weight = layer._parameters["weight"]
        if id(weight) not in by_param:
            where = sites[id(weight)]
            m = Member(
                tuple(weight.shape), 0, [n for n, _, _ in where], [(mod, a) for _, mod, a in where]
            )
            by_param[id(weight)] = FlatShard([(weight, m)], world, rank)
        flat = by_param[id(weight)]
        out.append(Unit(layer, flat, names.get(layer, "?"), "layer", [(layer, "weight", 0)]))
    for unit in out:  # the layer's weight is now its flat shard (the full one is freed)
        if unit.kind == "layer":
            unit.module._parameters["weight"] = unit.flat.param
    position = {m: i for i, m in enumerate(model.modules())}
    return sorted(out, key=lambda u: position[u.module])  # the order modules are listed


class Use:
    """One gathered copy of a unit's weights, from gather to free: in forward, and gathered
    again into the same storage for backward when autograd saved it, or a fresh one gathered
    for a checkpoint's recompute."""

    def __init__(self, fsdp: Any, unit: Unit):
        self.fsdp, self.unit = fsdp, unit
        self.buffer: torch.Tensor | None = None  # W * shard_numel elements, compute dtype
        self.work: Any = None
        self.saved = False  # autograd saved the gathered weights: backward needs them again
        self.resident = False
        self.backward_done = False
        self.entered_backward = False
        self.fwd_pos: int | None = None  # its entry in the forward prefetch plan
        self.bwd_pos: int | None = None  # its entry in the backward prefetch plan

    @property
    def label(self) -> str:
        return self.unit.label

    def start_gather(self) -> Use:
        f, flat = self.fsdp, self.unit.flat
        shard = flat.param.detach()
        send = shard if f.compute_dtype in (None, shard.dtype) else shard.to(f.compute_dtype)
        n = f.world_size * flat.shard_numel
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

    def fulls(self) -> tuple[torch.Tensor, ...]:
        """Each member's full tensor over the gathered storage (not views of the buffer: freeing
        the storage frees them, and a second gather refills what autograd saved)."""
        b = self.buffer
        storage = b.untyped_storage()
        return tuple(
            torch.empty(0, dtype=b.dtype, device=b.device).set_(storage, m.offset, m.shape)
            for m in self.unit.flat.members
        )


class Prefetch:
    """Gathers for a predicted sequence of uses, at most `window` ahead: entry i starts only
    once entry i - window has finished (an entry needed earlier starts on demand)."""

    def __init__(self, plan: list, window: int, start: Callable[[int], Use]):
        self.plan, self.window, self.start = plan, window, start
        self.uses: dict[int, Use] = {}
        self.finished: set[int] = set()
        self.taken: set[int] = set()  # handed to their layer: it frees them when done
        self.next = 0

    def pump(self) -> None:
        while self.next < len(self.plan):
            i = self.next
            if i not in self.uses:
                if i >= self.window and i - self.window not in self.finished:
                    return
                self.uses[i] = self.start(i)
            self.next += 1

    def take(self, i: int) -> Use:
        if i not in self.uses or i in self.finished:  # (a freed entry is gathered again)
            self.uses[i] = self.start(i)
            self.finished.discard(i)
        self.taken.add(i)
        self.pump()
        return self.uses[i]

    def finish(self, i: int) -> None:
        if i in self.uses and i not in self.finished:
            self.uses[i].free()
            self.finished.add(i)
            self.pump()

    def drain(self, at: int) -> None:
        """Stop prefetching at entry `at` (the prediction was wrong there): free every gathered
        weight no layer has taken (a taken one is freed by its `finish`: its layer still uses
        it) and predict nothing from `at` on."""
        for i, use in self.uses.items():
            if i not in self.finished and i not in self.taken:
                use.free()
                self.finished.add(i)
        self.plan = self.plan[: min(at, self.next)]

    def release(self) -> None:
        """Free everything this sequence gathered (the pass is over)."""
        for i, use in self.uses.items():
            if i not in self.finished:
                use.free()
                self.finished.add(i)
        self.plan = self.plan[: self.next]
