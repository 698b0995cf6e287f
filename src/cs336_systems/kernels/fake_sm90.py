"""A Triton driver for machines without a GPU that compiles for sm_90 and records each kernel
launch instead of running it: which compiled kernel, its grid, and its arguments (tensors as data
pointers, TMA descriptors as what the real launcher would encode: base pointer, shape, strides,
tile and swizzle).

What it is for: checking on a CPU machine that the launch path hands the kernels the same grids
and arguments whichever way it gets there (the JIT and autotuner path, or the launches bound
once per call shape by the kept programs of `kernels.flash_triton`), and timing the host-side Python of a
call (everything but the driver's C launch and the TMA descriptor encoding, which this driver
leaves out). The kernels are really compiled (Triton's own ptxas), so a first call takes
seconds per kernel; Triton's disk cache keeps them.

    from cs336_systems.kernels import fake_sm90
    fake_sm90.install()          # before any kernel is launched; TRITON_INTERPRET must be off
    ... calls on CPU tensors ...
    fake_sm90.LAUNCHES            # [Launch(kernel, grid, args), ...]

`install()` also makes the kernels' dispatch see a Hopper GPU for CPU tensors (the plans of an
H100), and the autotuner pick each kernel's first candidate without timing anything.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

# the C launcher's arguments before the kernel's (Triton's _BASE_ARGS_FORMAT: grid, stream,
# function, cooperative, pdl, two scratch pointers, packed metadata, launch metadata, two hooks),
# of which `CudaLauncher.__call__` adds 9 itself (all but metadata and hooks)
_BASE_ARGS = 13
_ADDED_BY_LAUNCHER = 9


class Launch(NamedTuple):
    kernel: str
    grid: tuple[int, int, int]
    args: tuple


LAUNCHES: list[Launch] = []
# whether to keep each launch's arguments (off when timing: the record costs Python too)
RECORD = True


def _normalized(arg, is_desc: bool, meta):
    """What the real launcher would make of one kernel argument. A host-side TMA descriptor is
    read as the real launcher reads it (`make_tensordesc_arg`: base, shape, strides, padding;
    tile and swizzle from the compiled kernel), whatever object carries those attributes."""
    if is_desc:
        if list(arg.strides)[-1] != 1:
            raise ValueError(f"{arg}: a TMA descriptor needs a unit last stride")
        return (
            "tma",
            arg.base.data_ptr(),
            tuple(int(s) for s in arg.shape),
            tuple(int(s) for s in arg.strides),
            None if meta is None else (tuple(meta["block_size"]), meta["swizzle"]),
            arg.padding,
        )
    if isinstance(arg, torch.Tensor):
        return ("ptr", arg.data_ptr(), arg.dtype)
    return arg


class _Launcher:
    """Stands in for the CUDA launcher of one compiled kernel (`CudaLauncher`): allocates the
    kernel's global scratch through Triton's allocator as the real one does, expands TMA
    descriptors, and records the launch."""

    def __init__(self, src, metadata):
        self.name = metadata.name
        signature = list(src.signature.values())
        self.desc_positions = {
            i: n
            for n, i in enumerate(
                i
                for i, s in enumerate(signature)
                if isinstance(s, str) and s.startswith("tensordesc")
            )
        }
        self.desc_meta = getattr(metadata, "tensordesc_meta", None) or []
        self.global_scratch_size = metadata.global_scratch_size
        self.global_scratch_align = metadata.global_scratch_align

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        from triton.runtime import _allocation

        if self.global_scratch_size > 0:
            size = grid_x * grid_y * grid_z * self.global_scratch_size
            _allocation._allocator.get()(size, self.global_scratch_align, stream)
        kernel_args = args[_BASE_ARGS - _ADDED_BY_LAUNCHER :]
        if not RECORD:
            return
        out = []
        for i, arg in enumerate(kernel_args):
            n = self.desc_positions.get(i)
            meta = self.desc_meta[n] if n is not None and n < len(self.desc_meta) else None
            out.append(_normalized(arg, n is not None, meta))
        LAUNCHES.append(Launch(self.name, (grid_x, grid_y, grid_z), tuple(out)))


class _Utils:
    def load_binary(self, name, kernel, shared, device):
        return 1, 1, 128, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536}


def _first_config_bench(kernel_call, quantiles=None, **kwargs):
    """The autotuner's timing, faked: every candidate 'takes' 1 ms, so it keeps the first."""
    return [1.0, 1.0, 1.0] if quantiles else 1.0


class FakeSm90Driver:
    """The parts of Triton's CUDA driver that compiling and launching use."""

    def __init__(self):
        self.utils = _Utils()
        self.launcher_cls = _Launcher

    @staticmethod
    def is_active():
        return True

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return 0

    def get_device_capability(self, device=None):
        return (9, 0)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cpu

    def get_benchmarker(self):
        return _first_config_bench

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def assemble_tensormap_to_arg(self, tensormaps_info, args):
        return args


def install() -> None:
    """Make Triton compile for sm_90 and record launches, and the kernels' dispatch plan CPU
    tensors as on an H100. Call before the kernels first launch, in a process without
    TRITON_INTERPRET (a test runs this in a child process)."""
    if os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on"):
        raise RuntimeError("fake_sm90 needs TRITON_INTERPRET unset: it compiles for sm_90")
    os.environ["TRITON_INTERPRET"] = "0"  # before the kernel modules decide
    from triton.runtime.driver import driver

    driver.set_active(FakeSm90Driver())

    from cs336_systems.kernels import dispatch, flash_triton, flash_triton_launch

    dispatch.target_of = lambda device: dispatch.HOPPER
    flash_triton_launch.descriptors_supported = lambda: True
    original_check = flash_triton.check_inputs

    def check_inputs(q, k, v):  # CPU tensors stand for CUDA ones
        from cs336_systems.kernels.flash_pytorch import check_attention_inputs

        check_attention_inputs(q, k, v, dtypes=flash_triton.DTYPES, max_head_dim=128)

    check_inputs.original = original_check
    flash_triton.check_inputs = check_inputs
    # device-side descriptors' scratch on the CPU
    flash_triton_launch._alloc = lambda size, alignment, stream: torch.empty(size, dtype=torch.int8)
    for tuned in flash_triton_launch._TUNED.values():
        tuned._do_bench = _first_config_bench
        tuned.cache_results = False
