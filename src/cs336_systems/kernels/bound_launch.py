"""Kernel launches bound once and replayed: the host side of a Triton or Gluon launch without the
JIT's per-call work.

A launch through `kernel[grid](*args, **kwargs)` (Triton's `JITFunction.run`, and the autotuner
in front of it) binds every argument, specializes each one (alignment, divisibility), builds a
cache key from them, looks the compiled kernel up, and only then calls the driver's launcher;
a Gluon launch also builds a host-side TMA descriptor object (a layout, validation) for every
tile stream. For our FlashAttention calls that Python is most of the call at short sequences.

`Step` runs one launch of a cached program (`kernels.flash_triton`): its first call goes
through the JIT as before (compiling, autotuning) and keeps what it launched (`Launched`);
`BoundLaunch` then holds the compiled kernel, the grid and the full argument list with the
positions where this call's tensors go, and later calls hand the driver's launcher the same list
with their own tensors in those positions. Valid because a program is kept per call key (shapes,
strides, dtypes, devices, pointer alignment and options: everything the JIT's specialization
and our plan read), so every other argument is the same at every call of that key.

Needs Triton internals (`JITFunction.device_caches` and its binder, `CompiledKernel.run`); where
they are missing (another Triton) or in the interpreter, `Step` launches through the JIT every
time (`binding_supported()` says which).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from cs336_systems.kernels.triton.common import INTERPRET

# how the launches went, for tests and the overhead probe: JIT launches, bound launches,
# launches that could not be bound (with why), and graph replays of a flash backward
# (kernels.flash_triton: each stands for its program's launches)
STATS = {"jit": 0, "bound": 0, "unbound": 0, "graph": 0}
UNBOUND: dict[str, str] = {}


class Launched(NamedTuple):
    """One launch through the JIT: the JIT function (the autotuner's own kernel for a tuned
    one), what it returned (the compiled kernel; None in the interpreter), the grid it ran on
    and the arguments it got, with the chosen configuration's keywords for a tuned kernel."""

    fn: object
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict


class _Desc(NamedTuple):
    """What the driver's launcher reads of a host-side TMA descriptor (`make_tensordesc_arg`):
    base tensor, shape, strides, padding. The tile and swizzle come from the compiled kernel."""

    base: torch.Tensor
    shape: list
    strides: list
    padding: str


def binding_supported() -> bool:
    """Whether launches can be bound on this Triton (compiled, not the interpreter); off with
    CS336_FLASH_BIND=0."""
    if INTERPRET or os.environ.get("CS336_FLASH_BIND", "1") == "0":
        return False
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover
        return False
    return hasattr(CompiledKernel, "run") and hasattr(JITFunction, "create_binder")


class BoundLaunch:
    """One launch ready to replay: compiled kernel, grid, argument list with holes for the
    call's tensors (`tensor_pos`) and TMA descriptors over them (`desc_pos`)."""

    __slots__ = ("name", "kernel", "grid", "template", "tensor_pos", "desc_pos", "device", "direct")

    def __init__(self, launched: Launched, slots: dict[int, int], device: int):
        fn, kernel, grid, args, kwargs = launched
        binder = fn.device_caches[device][4]
        bound, _, _ = binder(*args, **kwargs)
        template = list(bound.values())
        tensor_pos, desc_pos = [], []
        for i, value in enumerate(template):
            if isinstance(value, torch.Tensor):
                tensor_pos.append((i, _slot(slots, value, fn, i)))
                template[i] = None
            elif hasattr(value, "block_shape") and hasattr(value, "base"):
                slot = _slot(slots, value.base, fn, i)
                shape, strides = list(value.shape), list(value.strides)
                desc_pos.append((i, slot, shape, strides, value.padding))
                template[i] = None
        if hasattr(kernel, "result"):  # an asynchronous compile's future, as the JIT unwraps it
            kernel = kernel.result()
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.name = getattr(fn, "__name__", str(fn))
        self.kernel, self.grid, self.template = kernel, grid, template
        self.tensor_pos, self.desc_pos = tuple(tensor_pos), tuple(desc_pos)
        self.device = device
        self.direct = _Direct.of(kernel, template, self.tensor_pos, self.desc_pos, bound)

    def __call__(self, tensors, stream: int) -> None:
        direct = self.direct
        enter, leave = _hook(_knobs.launch_enter_hook), _hook(_knobs.launch_exit_hook)
        if direct is not None and enter is None and leave is None:
            direct(self.kernel, self.grid, tensors, stream)
            return
        args = self.template.copy()
        for i, slot in self.tensor_pos:
            args[i] = tensors[slot]
        for i, slot, shape, strides, padding in self.desc_pos:
            args[i] = _Desc(tensors[slot], shape, strides, padding)
        kernel = self.kernel
        grid = self.grid
        # Triton 3.6's hooks are chains, never None: an empty one is passed as None (the C
        # launcher then skips it, as it skips an empty chain), and the launch metadata, which
        # only hooks read, is built only where one has hooks (the JIT builds it every launch)
        metadata = None
        if enter is not None or leave is not None:
            metadata = kernel.launch_metadata(grid, stream, *args)
        kernel.run(
            grid[0],
            grid[1],
            grid[2],
            stream,
            kernel.function,
            kernel.packed_metadata,
            metadata,
            enter,
            leave,
            *args,
        )


class _Direct:
    """The C launch of a bound kernel without the launcher's Python around it: Triton's
    `CudaLauncher.__call__` allocates the scratch and, for a kernel with host-side TMA
    descriptors, its `wrap_handle_tensordesc` walks every argument and encodes each descriptor
    (`make_tensordesc_arg`: a Python call and `cuTensorMapEncodeTiled`) at every launch. Here the
    argument list is laid out once with the descriptors expanded in place, and an encoded
    descriptor is kept per base address (shape, strides, tile and swizzle are the program's, so
    the same address encodes the same map; the map holds the address, never the tensor).
    Measured on an H100: the Gluon dK/dV launch, 11 descriptors, took 25-47 us of host time
    through the launcher (docs/notes/flash-attention-notes.md, round 3)."""

    __slots__ = ("launch", "final", "tensor_holes", "desc_holes", "scratch", "coop", "pdl")
    MAX_MAPS = 64  # encoded descriptors kept per argument (then forgotten, all at once)

    @classmethod
    def of(cls, kernel, template, tensor_pos, desc_pos, bound) -> _Direct | None:
        """The direct launch of `kernel`, or None where its launcher is not Triton 3.6's
        (another Triton, a launcher with profile scratch): the launcher's own path stays."""
        try:
            from triton.backends.nvidia.driver import make_tensordesc_arg
        except ImportError:  # pragma: no cover
            return None
        launcher = kernel.run
        launch = getattr(launcher, "launch", None)
        needed = ("global_scratch_size", "global_scratch_align", "launch_cooperative_grid",
                  "launch_pdl", "num_ctas")  # fmt: skip
        if launch is None or not all(hasattr(launcher, a) for a in needed):
            return None
        if getattr(launcher, "profile_scratch_size", 0):
            return None
        meta = getattr(kernel.metadata, "tensordesc_meta", None)
        if desc_pos:
            # the C launch inside `wrap_handle_tensordesc`'s wrapper
            free = getattr(getattr(launch, "__code__", None), "co_freevars", ())
            cells = dict(
                zip(free, (c.cell_contents for c in launch.__closure__ or ()), strict=True)
            )
            launch = cells.get("launcher")
            if launch is None or (meta and len(meta) != len(desc_pos)):
                return None
        self = cls()
        self.launch = launch
        values = list(bound.values())
        final, tensor_holes, desc_holes = [], [], []
        tensor_at = dict(tensor_pos)
        descs = {i: (n, rest) for n, (i, *rest) in enumerate(desc_pos)}
        for i, value in enumerate(template):
            if i in tensor_at:
                tensor_holes.append((len(final), tensor_at[i]))
                final.append(None)
            elif i in descs:
                n, (slot, shape, strides, padding) = descs[i]
                m = meta[n] if meta else None
                width = len(make_tensordesc_arg(values[i], m))
                start = len(final)
                final.extend([None] * width)
                desc_holes.append((start, start + width, slot, shape, strides, padding, m, {}))
            else:
                final.append(value)
        self.final, self.tensor_holes, self.desc_holes = (
            final,
            tuple(tensor_holes),
            tuple(desc_holes),
        )
        size = launcher.global_scratch_size
        self.scratch = (size * launcher.num_ctas, launcher.global_scratch_align) if size else None
        self.coop, self.pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
        return self

    def __call__(self, kernel, grid, tensors, stream: int) -> None:
        args = self.final.copy()
        for pos, slot in self.tensor_holes:
            args[pos] = tensors[slot]
        for start, end, slot, shape, strides, padding, meta, maps in self.desc_holes:
            base = tensors[slot]
            if meta is None:  # expanded to pointer, shape, strides: nothing encoded to keep
                args[start:end] = _make_tensordesc_arg(_Desc(base, shape, strides, padding), None)
                continue
            key = base.data_ptr()
            encoded = maps.get(key)
            if encoded is None:
                if len(maps) >= self.MAX_MAPS:
                    maps.clear()
                encoded = _make_tensordesc_arg(_Desc(base, shape, strides, padding), meta)
                maps[key] = encoded
            args[start:end] = encoded
        gx, gy, gz = grid
        scratch = None
        if self.scratch is not None:
            from triton.runtime import _allocation

            size, align = self.scratch
            scratch = _allocation._allocator.get()(gx * gy * gz * size, align, stream)
        self.launch(gx, gy, gz, stream, kernel.function, self.coop, self.pdl, scratch, None,
                    kernel.packed_metadata, None, None, None, *args)  # fmt: skip


def _make_tensordesc_arg(arg, meta):
    global _make_tensordesc_arg
    from triton.backends.nvidia.driver import make_tensordesc_arg

    _make_tensordesc_arg = make_tensordesc_arg  # later calls go straight to Triton's
    return make_tensordesc_arg(arg, meta)


def _hook(hook):
    """A launch hook as the C launcher should get it: None for no hook or an empty chain."""
    if hook is None or not getattr(hook, "calls", True):
        return None
    return hook


def _slot(slots: dict[int, int], tensor, fn, position: int) -> int:
    try:
        return slots[id(tensor)]
    except KeyError:
        raise ValueError(
            f"{getattr(fn, '__name__', fn)}: argument {position} is a tensor the program does not "
            f"pass per call (made inside the launcher?); it cannot be bound"
        ) from None


try:
    from triton import knobs as _triton_knobs

    _knobs = _triton_knobs.runtime
except ImportError:  # pragma: no cover

    class _NoHooks:
        launch_enter_hook = None
        launch_exit_hook = None

    _knobs = _NoHooks()


class Step:
    """One kernel launch of a program. `launch(tensors)` launches through the JIT (compiling and
    autotuning where needed) and returns (what to report of it, `Launched` or None); the first
    call runs it, and, where `bind`, keeps a `BoundLaunch` that later calls replay with their
    tensors (the same positions of the same tuple). `reported` is what the first call said.

    A launch that should be bound and is not is never silent: where binding fails (nothing to
    bind, or `BoundLaunch` refuses), `why` says why, `UNBOUND[name]` too, and that launch and
    every later one of this step count in `STATS["unbound"]` (and in "jit": they run there)."""

    __slots__ = ("name", "launch", "bind", "bound", "reported", "why")

    def __init__(self, name: str, launch, bind: bool):
        self.name, self.launch, self.bind = name, launch, bind
        self.bound: BoundLaunch | None = None
        self.reported = None
        self.why: str | None = None

    def __call__(self, tensors, device: int, stream: int) -> None:
        bound = self.bound
        if bound is not None and bound.device == device:
            STATS["bound"] += 1
            bound(tensors, stream)
            return
        self.reported, launched = self.launch(tensors)
        STATS["jit"] += 1
        if self.why is not None:
            STATS["unbound"] += 1
            return
        if not self.bind:
            return
        if launched is None:
            why = "the launcher returned no launch (a tuned configuration with a pre-hook runs it)"
        elif launched.kernel is None:
            why = "the JIT returned no compiled kernel (the interpreter, or a warmup)"
        else:
            slots = {id(t): i for i, t in enumerate(tensors) if t is not None}
            try:
                self.bound = BoundLaunch(launched, slots, device)
                return
            except Exception as exc:  # the JIT path stays: correct, only slower
                why = f"{type(exc).__name__}: {exc}"
        self.why = why
        STATS["unbound"] += 1
        UNBOUND[self.name] = why
