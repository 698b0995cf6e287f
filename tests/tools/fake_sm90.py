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

    import fake_sm90             # tests/tools/ on sys.path
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


class Launch(NamedTuple):
    kernel: str
    grid: tuple[int, int, int]
    args: tuple


LAUNCHES: list[Launch] = []
# whether to keep each launch's arguments (off when timing: the record costs Python too)
RECORD = True


class _TensorMap(NamedTuple):
    """What `fill_tma_descriptor` encodes into a CUtensorMap (the real one is 128 opaque bytes)."""

    ptr: int
    shape: tuple
    strides: tuple
    block: tuple
    swizzle: int
    elem_size: int
    padding: int


def _normalized(arg):
    """One argument of the C launch as the record keeps it: a tensor as its data pointer and
    dtype, an encoded TMA descriptor as what it encodes, anything else as it is."""
    if isinstance(arg, _TensorMap):
        return ("tma", arg.ptr, arg.shape, arg.strides, arg.block, arg.swizzle, arg.padding)
    if isinstance(arg, torch.Tensor):
        return ("ptr", arg.data_ptr(), arg.dtype)
    return arg


class _Launcher:
    """Stands in for the CUDA launcher of one compiled kernel (`CudaLauncher`), built the same
    way: `launch` is the C launch wrapped by Triton's own `wrap_handle_tensordesc` (host-side TMA
    descriptors expanded by `make_tensordesc_arg`, encoded by the fake `fill_tma_descriptor`),
    and `__call__` allocates the kernel's global scratch through Triton's allocator as the real
    one does. The fake C launch records the launch: its arguments as the kernel would get them."""

    def __init__(self, src, metadata):
        from triton.backends.nvidia.driver import wrap_handle_tensordesc

        self.name = metadata.name
        signature = dict(src.signature.items())
        tensordesc_meta = getattr(metadata, "tensordesc_meta", None)
        self.launch = wrap_handle_tensordesc(self._c_launch, signature, tensordesc_meta)
        self.num_ctas = getattr(metadata, "num_ctas", 1)
        self.global_scratch_size = metadata.global_scratch_size
        self.global_scratch_align = metadata.global_scratch_align
        self.profile_scratch_size = getattr(metadata, "profile_scratch_size", 0)
        self.profile_scratch_align = getattr(metadata, "profile_scratch_align", 1)
        self.launch_cooperative_grid = metadata.launch_cooperative_grid
        self.launch_pdl = getattr(metadata, "launch_pdl", False)

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        from triton.runtime import _allocation

        scratch = None
        if self.global_scratch_size > 0:
            size = grid_x * grid_y * grid_z * self.num_ctas * self.global_scratch_size
            scratch = _allocation._allocator.get()(size, self.global_scratch_align, stream)
        self.launch(grid_x, grid_y, grid_z, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, scratch, None, *args)  # fmt: skip

    def _c_launch(self, grid_x, grid_y, grid_z, stream, function, cooperative, pdl, scratch,
                  profile_scratch, packed_metadata, launch_metadata, enter, leave, *kernel_args):  # fmt: skip
        if self.global_scratch_size > 0 and scratch is None:
            raise ValueError(f"{self.name}: launched without its global scratch")
        if not RECORD:
            return
        out = tuple(_normalized(a) for a in kernel_args)
        LAUNCHES.append(Launch(self.name, (grid_x, grid_y, grid_z), out))


class _Utils:
    def load_binary(self, name, kernel, shared, device):
        return 1, 1, 128, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536}

    def fill_tma_descriptor(self, ptr, swizzle, elem_size, dtype, block, shape, strides, padding):
        if list(strides)[-1] != 1:
            raise ValueError("a TMA descriptor needs a unit last stride")
        return _TensorMap(int(ptr), tuple(map(int, shape)), tuple(map(int, strides)),
                          tuple(map(int, block)), int(swizzle), int(elem_size), int(padding))  # fmt: skip


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

    from cs336_systems.kernels import dispatch, flash_triton
    from cs336_systems.kernels.triton import launch as triton_launch

    dispatch.target_of = lambda device: dispatch.HOPPER
    triton_launch.descriptors_supported = lambda: True
    original_check = flash_triton.check_inputs

    def check_inputs(q, k, v):  # CPU tensors stand for CUDA ones
        from cs336_systems.kernels.flash_pytorch import check_attention_inputs

        check_attention_inputs(q, k, v, dtypes=flash_triton.DTYPES, max_head_dim=128)

    check_inputs.original = original_check
    flash_triton.check_inputs = check_inputs
    # device-side descriptors' scratch on the CPU
    triton_launch._alloc = lambda size, alignment, stream: torch.empty(size, dtype=torch.int8)
    for tuned in triton_launch._TUNED.values():
        tuned._do_bench = _first_config_bench
        tuned.cache_results = False
