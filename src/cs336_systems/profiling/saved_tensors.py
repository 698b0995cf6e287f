"""What autograd keeps for backward, tensor by tensor, and how much memory is live at its peak.

- ``SavedTensorLog``: inside ``with log.recording(module):``, every tensor autograd saves passes
  through ``torch.autograd.graph.saved_tensors_hooks``; the log keeps its shape, dtype and bytes,
  whether it is a parameter, a buffer or an input of the recorded call (those are not
  activations), the module whose forward was running, and its storage (a tensor saved by two ops,
  or a view of another saved tensor, costs memory once). ``attribute(output)`` then walks the
  autograd graph from `output` and unpacks every node's saved tensors once, which names the
  op that saved each one: ``MmBackward0.self``, ``SoftmaxBackward0.result``, or, under
  torch.compile, ``CompiledFunctionBackward`` with the name of the value in the partitioned
  forward graph (``mm_4``, ``rsqrt``) when ``compile_backend`` captured it.
- ``compile_backend(kind, names)``: a torch.compile backend that records which values the
  forward graph keeps for backward: ``inductor`` (the real compiler) or ``partition`` (the same
  AOT autograd with inductor's decompositions and its min-cut partitioner, no code generation:
  runs on the meta device, so a CPU can account for an xl block without allocating it).
- ``LiveTensorBytes``: a dispatch mode that adds up the storages of every tensor created while
  it is active, until each is freed, and keeps the peak: the memory a step adds on any device,
  without the allocator (on CUDA compare with ``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

MiB = 2**20


@dataclass
class Saved:
    index: int  # order of saving
    shape: tuple
    dtype: str
    bytes: int  # numel * element size of the saved tensor (the handout's count)
    storage_bytes: int  # its whole storage: what memory holds
    storage: int  # storages numbered in order of first save
    first: bool  # the first save of its storage (unique bytes are counted here)
    kind: str  # activation, parameter, buffer or input
    module: str  # the module whose forward saved it ("" outside any)
    op: str = "?"  # the autograd node and slot that saved it (attribute)


def _storage(t: torch.Tensor) -> Any:
    return t.untyped_storage()


class SavedTensorLog:
    """Saved tensors of the calls made inside ``recording(...)`` (module doc)."""

    def __init__(self) -> None:
        self.saved: list[Saved] = []
        self._tensors: list[torch.Tensor] = []
        # storage objects are kept alive while the log lives, so their ids stay unique
        self._storages: dict[int, Any] = {}
        self._numbers: dict[int, int] = {}  # storage id -> number, in order of first save
        self._kinds: dict[int, str] = {}
        self._modules: list[str] = []
        self._unpacking: str | None = None
        self._labels: dict[int, list[str]] = {}
        # per compiled graph: (name, op, module) of each value it saves (compile_backend)
        self.graph_names: list[list[tuple[str, str, str]]] = []

    @contextlib.contextmanager
    def recording(
        self, module: torch.nn.Module | None = None, inputs: Iterable[torch.Tensor] = ()
    ) -> Iterator[SavedTensorLog]:
        """Log what is saved inside the block; `module`'s parameters and buffers and `inputs`
        are marked as such (not activations), its submodules' names say who saved what."""
        if module is not None:
            for kind, tensors in (("parameter", module.parameters()), ("buffer", module.buffers())):
                for t in tensors:
                    self._mark(t, kind)
        for t in inputs:
            self._mark(t, "input")
        handles = []
        if module is not None:
            for name, sub in module.named_modules():
                handles.append(sub.register_forward_pre_hook(self._enter(name)))
                handles.append(sub.register_forward_hook(self._leave))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            for h in handles:
                h.remove()
            self._modules.clear()

    def _mark(self, t: torch.Tensor, kind: str) -> None:
        st = _storage(t)
        self._storages.setdefault(id(st), st)
        self._kinds.setdefault(id(st), kind)

    def _enter(self, name: str):
        def hook(_module, _args):
            self._modules.append(name)

        return hook

    def _leave(self, _module, _args, _out):
        if self._modules:
            self._modules.pop()

    def _pack(self, t: torch.Tensor) -> int:
        st = _storage(t)
        key = id(st)
        self._storages.setdefault(key, st)
        first = key not in self._numbers
        if first:
            self._numbers[key] = len(self._numbers)
        number = self._numbers[key]
        kind = self._kinds.get(key, "activation")
        if isinstance(t, torch.nn.Parameter):
            kind = "parameter"
        index = len(self.saved)
        self.saved.append(
            Saved(
                index=index,
                shape=tuple(t.shape),
                dtype=str(t.dtype).removeprefix("torch."),
                bytes=t.numel() * t.element_size(),
                storage_bytes=st.nbytes(),
                storage=number,
                first=first,
                kind=kind,
                module=self._modules[-1] if self._modules else "",
            )
        )
        # detached: the log holding `t` itself (and so its grad_fn, whose saved tensors hold
        # the log's hooks) would be a reference cycle through C++ that is never collected
        self._tensors.append(t.detach())
        return index

    def _unpack(self, index: int) -> torch.Tensor:
        if self._unpacking is not None:
            self._labels.setdefault(index, []).append(self._unpacking)
        return self._tensors[index]

    def attribute(self, *outputs: torch.Tensor) -> None:
        """Name the op that saved each tensor: walk the graph from `outputs`, unpack each node's
        saved tensors once (graph names from ``compile_backend`` for compiled nodes)."""
        seen: set = set()
        stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
        compiled = 0
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            name = node.name()
            attrs = [a for a in dir(node) if a.startswith("_saved_")]
            if not attrs and hasattr(node, "saved_tensors"):
                attrs = ["saved_tensors"]
            for attr in attrs:
                self._unpacking = name if attr == "saved_tensors" else f"{name}.{attr[7:]}"
                before = set(self._labels)
                try:
                    getattr(node, attr)
                except RuntimeError:  # freed already, or not a tensor slot
                    pass
                finally:
                    self._unpacking = None
                if attr == "saved_tensors" and "Compiled" in name:
                    self._name_compiled(sorted(set(self._labels) - before), compiled)
                    compiled += 1
            stack.extend(nxt for nxt, _ in node.next_functions)
        for s in self.saved:
            s.op = " + ".join(dict.fromkeys(self._labels.get(s.index, ["?"])))

    def _name_compiled(self, indices: list[int], graph: int) -> None:
        """Compiled nodes save their graph's kept values in order (after its outputs)."""
        if graph >= len(self.graph_names):
            return
        names = self.graph_names[-1 - graph]
        if len(names) != len(indices):
            return
        for i, (name, op, module) in zip(indices, names, strict=True):
            self._labels[i] = [f"{self._labels[i][0]}:{name} ({op})"]
            self.saved[i].module = self.saved[i].module or module

    def rows(self) -> list[dict]:
        return [asdict(s) for s in self.saved]

    def totals(self) -> dict[str, float]:
        """Bytes of activations: every save counted (``all_saves``, the handout's sum) and each
        storage once (``unique``, what memory holds); parameters, buffers and inputs apart."""
        act = [s for s in self.saved if s.kind == "activation"]
        return {
            "saved_tensors": len(self.saved),
            "activation_saves": len(act),
            "activation_bytes_all_saves": sum(s.bytes for s in act),
            "activation_bytes_unique": sum(s.storage_bytes for s in act if s.first),
            "input_bytes": sum(
                s.storage_bytes for s in self.saved if s.kind == "input" and s.first
            ),
            "parameter_saves": sum(s.kind == "parameter" for s in self.saved),
            "buffer_saves": sum(s.kind == "buffer" for s in self.saved),
        }


def _fx_op(node) -> str:
    """The aten op that produced an FX node (`mm`, `rsqrt`, `div`), `input` for placeholders."""
    if node.op == "placeholder":
        return "input"
    target = getattr(node.target, "__name__", str(node.target))
    return target.split(".")[0]


def _fx_module(node) -> str:
    """The module path (`attn.q_proj`) that dynamo recorded for an FX node, "" if none."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    for prefix in ("L['self'].", "L['self']"):
        path = path.removeprefix(prefix)
    return path.replace("._modules['", ".").replace("']", "").lstrip(".")


def compile_backend(kind: str, names: list[list[tuple[str, str, str]]]):
    """A torch.compile backend that appends, per compiled graph, the names of the values its
    forward keeps for backward to `names` (``kind``: ``inductor`` or ``partition``)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def recording_partition(joint, inputs, **kwargs):
        kwargs.setdefault("compiler", "inductor")
        fw, bw = min_cut_rematerialization_partition(joint, inputs, **kwargs)
        out = next(n for n in fw.graph.nodes if n.op == "output")
        n_out = kwargs.get("num_fwd_outputs", 0)
        # symbolic sizes are saved apart from tensors; keep tensor values only
        names.append(
            [
                (v.name, _fx_op(v), _fx_module(v))
                for v in out.args[0][n_out:]
                if isinstance(getattr(v, "meta", {}).get("val"), torch.Tensor)
            ]
        )
        return fw, bw

    if kind == "inductor":
        import torch._inductor.compile_fx as compile_fx

        def inductor(gm, example_inputs):
            original = compile_fx.min_cut_rematerialization_partition
            compile_fx.min_cut_rematerialization_partition = recording_partition
            try:
                return compile_fx.compile_fx(gm, example_inputs)
            finally:
                compile_fx.min_cut_rematerialization_partition = original

        return inductor
    if kind == "partition":
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.decomposition import select_decomp_table

        def run_graph(gm, _example_inputs):
            return make_boxed_func(gm.forward)

        return aot_autograd(
            fw_compiler=run_graph,
            bw_compiler=run_graph,
            partition_fn=recording_partition,
            decompositions=select_decomp_table(),
        )
    raise ValueError(f"unknown compile backend {kind!r}; known: inductor, partition")


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the storages created while active and not yet freed: ``live``, ``peak``.

    Views and in-place results share a storage already counted. Tensors that existed before
    (parameters, optimizer state) are not counted, so ``peak`` is what the step adds.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # a view or an in-place result shares an input's storage: nothing new (an input may
        # predate the mode: a parameter's gradient accumulated in place)
        inputs = {
            id(t.untyped_storage())
            for t in pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs:
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._sizes:
            return
        n = st.nbytes()
        self._sizes[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)
