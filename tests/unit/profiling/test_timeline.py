"""profiling/timeline.py: a step's wall time on the device timeline split into parts that add up
to it, on hand-made kernels (CPU) and on a real profiled step (GPU)."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.profiling.timeline import Kernel, split_step


def k(start, end, stream, name, path=None):
    return Kernel(start, end, stream, name, path or name)


def classify(path: str) -> str:
    return "matmul" if "gemm" in path else ("optimizer" if "adam" in path else "other")


def test_parts_exposed_hidden_and_idle_add_up_to_the_window():
    kernels = [
        k(0, 100, 7, "gemm_a"),  # compute alone 0-40, with NCCL 40-100
        k(40, 160, 13, "ncclDevKernel_AllGather"),  # hidden 40-100 and 110-120, exposed 100-110
        k(110, 130, 7, "adam_kernel"),  # and 120-130 with the NCCL kernel
        k(115, 125, 8, "gemm_b"),  # a second compute stream: 115-125 shared with adam
        # idle 160-170 (the host), then a kernel that straddles the window's end
        k(170, 220, 7, "elementwise"),
    ]
    out = split_step(kernels, (0.0, 200.0), classify)
    parts = out["matmul"] + out["optimizer"] + out["other"]
    assert parts + out["communication_exposed"] + out["idle"] == pytest.approx(out["window"])
    assert out["window"] == pytest.approx(0.2)
    # matmul: gemm_a 100 us + half of 115-125; optimizer: adam 20 us less half of 115-125
    assert out["matmul"] == pytest.approx(0.105)
    assert out["optimizer"] == pytest.approx(0.015)
    assert out["other"] == pytest.approx(0.030)  # 170-200 inside the window
    assert out["communication_exposed"] == pytest.approx(0.010 + 0.030)  # 100-110, 130-160
    assert out["communication_hidden"] == pytest.approx(0.060 + 0.020)  # 40-100, 110-130
    assert out["idle"] == pytest.approx(0.010)  # 160-170
    assert out["communication_busy"] == pytest.approx(0.120)
    assert out["compute_busy"] == pytest.approx(0.100 + 0.020 + 0.030)


def test_kernels_outside_the_window_do_not_count():
    kernels = [k(-50, -10, 7, "gemm_prev"), k(-5, 5, 7, "gemm_edge"), k(300, 400, 7, "gemm")]
    out = split_step(kernels, (0.0, 100.0), classify)
    assert out["matmul"] == pytest.approx(0.005)
    assert out["idle"] == pytest.approx(0.095)


def test_the_window_starts_at_the_host_range_not_its_device_copy():
    """The profile lists the step's range twice, on the host and (later, spanning only kernels
    launched one by one) on the device: the window is the host's, to the last kernel's end."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from cs336_systems.profiling.timeline import step_window

    host = NS(name="a_step", device_type=DeviceType.CPU, time_range=NS(start=0.0, end=50.0))
    device = NS(name="a_step", device_type=DeviceType.CUDA, time_range=NS(start=900.0, end=990.0))
    prof = NS(events=lambda: [host, device])
    kernels = [Kernel(10, 800, 7, "replayed_gemm", "gemm"), Kernel(900, 990, 7, "copy", "copy")]
    assert step_window(prof, "a_step", kernels) == (0.0, 990.0)
    with pytest.raises(ValueError, match="no 'other' range"):
        step_window(prof, "other", kernels)


@pytest.mark.gpu
def test_a_profiled_gpu_step_adds_up_and_names_its_parts():
    """A real step (matmuls, an elementwise kernel, AdamW) on the GPU: every kernel found with
    its stream and operator path, and the parts add up to the step's window."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from torch.profiler import ProfilerActivity, profile, record_function

    from cs336_systems.engine.leaderboard_rules import classify as step_classify
    from cs336_systems.profiling.timeline import gpu_kernels, step_window

    dev = torch.device("cuda")
    w = torch.randn(2048, 2048, device=dev, requires_grad=True)
    opt = torch.optim.AdamW([w], fused=True)
    x = torch.randn(4096, 2048, device=dev)

    def step():
        (torch.relu(x @ w) @ w).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("a_step"):
            step()
        torch.cuda.synchronize()
    kernels = gpu_kernels(prof)
    window = step_window(prof, "a_step", kernels)
    out = split_step(kernels, window, step_classify)
    parts = sum(v for p, v in out.items() if p in ("matmul", "optimizer", "other", "loss"))
    assert parts + out["communication_exposed"] + out["idle"] == pytest.approx(out["window"])
    assert out["matmul"] > 0 and out["optimizer"] > 0
    assert any("aten::mm" in kern.path for kern in kernels)
    # the record_function range's device-side annotation is not a kernel (it spans the step)
    assert not any(kern.name in ("a_step", "Optimizer.step#AdamW.step") for kern in kernels)
    assert out["idle"] < out["window"]
    assert len({kern.stream for kern in kernels}) >= 1

    # a CUDA graph's replay: its kernels are in the window (the range's device-side copy spans
    # only the kernels launched one by one, here the copy after the replay)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = torch.relu(x @ w.detach()) @ w.detach()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        y = torch.relu(x @ w.detach()) @ w.detach()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("a_step"):
            graph.replay()
            y.clone()
        torch.cuda.synchronize()
    kernels = gpu_kernels(prof)
    lo, hi = step_window(prof, "a_step", kernels)
    assert len(kernels) >= 3 and all(lo <= k.start_us and k.end_us <= hi for k in kernels)
