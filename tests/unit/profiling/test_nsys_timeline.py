"""The timeline reader (profiling/nsys_timeline.py) on the committed nsys export, a synthetic
export with NCCL kernels and memory events, a synthetic GPU trace and a CPU torch.profiler trace
of a tiny block; the figure (reporting/timelines.py) drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from nsys_tables import COMPUTE_STREAM, KERNELS, NCCL_STREAM, write_gpu_trace, write_nsys_sqlite

from cs336_systems.profiling import nsys, nsys_timeline
from cs336_systems.reporting import timelines
from cs336_systems.reporting.analysis import placeholder_reason

FIXTURE = Path(__file__).parents[2] / "fixtures" / "gpu" / "nsys_events.sqlite"
MiB = 2**20


def test_fixture_export_rows():
    """The H100 capture: every kernel on its one stream, its NVTX ranges, no NCCL kernel and no
    memory track (it was recorded without --cuda-memory-usage): said, not drawn empty."""
    tl = nsys_timeline.read_sqlite(FIXTURE)
    kernels, ranges = nsys.events_from_sqlite(FIXTURE)
    assert len(tl.kernels) == len(kernels) == 1470
    assert set(tl.kernels["stream"]) == {7}
    assert tl.communication.empty and len(tl.compute) == 1470
    assert {"forward", "backward", "attention.softmax"} <= set(tl.ranges["name"])
    assert tl.memory is None and "no CUDA memory usage events" in tl.memory_what
    # the window of one point's forward: its range, extended to its kernels' last end
    (fwd,) = tl.ranges[tl.ranges["name"] == "point 64/forward"].itertuples()
    lo, hi = nsys_timeline.window_of(tl, "point 64/forward")
    assert lo == fwd.start_ns and hi >= fwd.end_ns
    inside = tl.kernels[(tl.kernels["launch_ns"] >= lo) & (tl.kernels["launch_ns"] <= fwd.end_ns)]
    assert len(inside) > 10 and hi == max(fwd.end_ns, inside["end_ns"].max())
    clipped = nsys_timeline.clip(tl, (lo, hi))
    assert 0 < len(clipped.kernels) < len(tl.kernels)
    assert (clipped.kernels["end_ns"] > lo).all() and (clipped.kernels["start_ns"] < hi).all()
    assert nsys_timeline.window_of(tl, "no such range") is None


def test_synthetic_export_nccl_row_memory_and_window(tmp_path):
    tl = nsys_timeline.read_sqlite(write_nsys_sqlite(tmp_path / "cap.sqlite"))
    assert set(tl.compute["stream"]) == {COMPUTE_STREAM}
    assert set(tl.communication["stream"]) == {NCCL_STREAM} and len(tl.communication) == 2
    # cudaMalloc 100 MiB, 50 MiB, cudaFree 100 MiB: in use after each
    assert list(tl.memory["bytes"] / MiB) == [100, 150, 50]
    assert "cudaMalloc" in tl.memory_what
    # block.forward .. block.backward, extended to the all-reduce launched inside backward
    window = nsys_timeline.window_of(tl, r"block\.(forward|backward)")
    assert window == (850, 130_000)
    clipped = nsys_timeline.clip(tl, window)
    assert "warmup" not in set(clipped.ranges["name"])
    # the memory track starts with what was in use at the window's start
    assert clipped.memory["bytes"].iloc[0] == 100 * MiB
    saved = nsys_timeline.load(nsys_timeline.save(clipped, tmp_path / "w.timeline.json.gz"))
    assert saved.window == window and saved.source == nsys_timeline.NSYS
    assert list(saved.kernels["comm"]) == list(clipped.kernels["comm"])
    assert saved.memory["bytes"].tolist() == clipped.memory["bytes"].tolist()


def test_trim_keeps_the_timeline_tables(tmp_path):
    src = write_nsys_sqlite(tmp_path / "full.sqlite")
    trimmed = nsys.trim_sqlite(src, tmp_path / "t" / "trim.sqlite", nsys_timeline.TABLES)
    tl = nsys_timeline.read_sqlite(trimmed)
    assert tl.memory is not None and len(tl.communication) == 2
    # the default trim (events_from_sqlite's tables) drops the memory track
    tl = nsys_timeline.read_sqlite(nsys.trim_sqlite(src, tmp_path / "plain.sqlite"))
    assert tl.memory is None


def test_gpu_trace_reads_as_the_export_does(tmp_path):
    """torch.profiler's trace of the same capture: the same rows, launch times, memory."""
    trace = nsys_timeline.read(write_gpu_trace(tmp_path / "trace.json"))
    export = nsys_timeline.read(write_nsys_sqlite(tmp_path / "cap.sqlite"))
    assert trace.source == nsys_timeline.TORCH
    assert sorted(trace.kernels["launch_ns"].round()) == sorted(k[4] for k in KERNELS)
    assert list(trace.kernels["comm"]) == list(export.kernels["comm"])
    assert list(trace.memory["bytes"]) == list(export.memory["bytes"])
    pattern = r"block\.(forward|backward)"
    assert nsys_timeline.window_of(trace, pattern) == pytest.approx((850, 130_000))


def _cpu_block_trace(path: Path) -> Path:
    """A tiny TransformerBlock's forward and backward under torch.profiler on the CPU."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from cs336_systems.model import RotaryEmbedding, TransformerBlock

    torch.manual_seed(0)
    block = TransformerBlock(32, 2, 64, RotaryEmbedding(16, 16))
    x = torch.randn(2, 16, 32, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("warm"):
            block(x)
        with record_function("block.forward"):
            out = block(x)
        with record_function("block.backward"):
            out.sum().backward()
    prof.export_chrome_trace(str(path))
    return path


def test_cpu_trace_rows_and_window(tmp_path):
    tl = nsys_timeline.read_chrome_trace(_cpu_block_trace(tmp_path / "cpu.json"))
    assert tl.source == nsys_timeline.TORCH and "CPU operators" in tl.compute_what
    names = set(tl.compute["name"])
    assert "aten::linear" in names or "aten::matmul" in names
    assert tl.communication.empty and tl.memory is not None and tl.memory["bytes"].max() > 0
    fwd = tl.ranges[tl.ranges["name"] == "block.forward"].iloc[0]
    bwd = tl.ranges[tl.ranges["name"] == "block.backward"].iloc[0]
    window = nsys_timeline.window_of(tl, r"block\.(forward|backward)")
    assert window == (fwd["start_ns"], bwd["end_ns"])
    clipped = nsys_timeline.clip(tl, window)
    assert "warm" not in set(clipped.ranges["name"])
    # outermost operators only: none inside another on the main thread
    ops = clipped.compute.sort_values("start_ns")
    assert (ops["start_ns"].iloc[1:].to_numpy() >= ops["end_ns"].iloc[:-1].to_numpy()).all()
    out = nsys_timeline.save_window(
        tmp_path / "cpu.json", "no match", tmp_path / "a.timeline.json.gz"
    )
    assert "no range named 'no match'" in nsys_timeline.load(out).notes[0]


def test_short_names():
    assert timelines.short_name(KERNELS[0][0]) == "gemm_kernel"
    assert timelines.short_name(KERNELS[2][0]) == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    assert timelines.short_name("aten::linear") == "linear"
    assert timelines.short_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"


def _label_boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        for t in ax.texts:
            if t.get_text() and t.get_fontsize() <= timelines.LABEL_PT:
                out.append((t.get_text(), t.get_window_extent(renderer)))
    return out


def test_figure_rows_labels_and_note(tmp_path, monkeypatch):
    """Two panels (the export and the CPU trace): rows named, the NCCL row present, the longest
    kernels labelled without two labels meeting, each panel's source in its title."""
    import matplotlib.pyplot as plt

    export = nsys_timeline.read_sqlite(write_nsys_sqlite(tmp_path / "cap.sqlite"))
    export = nsys_timeline.clip(export, nsys_timeline.window_of(export, r"block\..*"))
    cpu = nsys_timeline.read_chrome_trace(_cpu_block_trace(tmp_path / "cpu.json"))
    cpu = nsys_timeline.clip(cpu, nsys_timeline.window_of(cpu, r"block\..*"))
    labels = [label for label, _ in timelines.lanes(export)]
    assert labels == ["NVTX", "compute\nstream 7", "NCCL\nstream 13"]
    assert [label for label, _ in timelines.lanes(cpu)][-2:] == [
        "CPU ops\n(main thread)",
        "gloo\n(worker threads)",
    ]
    kept = {}
    monkeypatch.setattr(timelines, "save", lambda fig, path, tight=True: kept.setdefault("f", fig))
    # one time scale across panels: the CPU trace (ms) would make the export's kernels (us)
    # too thin to label, so each source is a figure of its own here
    # the CPU's ranges as long as they ran: those over a tenth of the window are labelled
    lo, hi = cpu.window
    wide = cpu.ranges[(cpu.ranges["end_ns"] - cpu.ranges["start_ns"]) > (hi - lo) / 10]
    assert len(wide)
    for tl, source, must in [
        (export, "from Nsight Systems", {"gemm_kernel", "block.forward", "block.backward"}),
        (cpu, "torch.profiler trace (no nsys capture)", set(wide["name"])),
    ]:
        kept.clear()
        panels = [timelines.Panel("one", tl), timelines.Panel("absent", None, "nsys absent")]
        fig = timelines.draw(panels, tmp_path / "t.png", "test")
        titles = [ax.get_title(loc="left") for ax in fig.axes]
        assert any(source in t for t in titles)
        boxes = _label_boxes(fig)
        assert must <= {t for t, _ in boxes}
        for i, (a, ba) in enumerate(boxes):
            for b, bb in boxes[i + 1 :]:
                assert not ba.overlaps(bb), f"labels {a!r} and {b!r} meet"
        plt.close(fig)


def test_figure_files_and_placeholder(tmp_path):
    export = nsys_timeline.read_sqlite(write_nsys_sqlite(tmp_path / "cap.sqlite"))
    png = timelines.draw([timelines.Panel("export", export)], tmp_path / "f.png", "t")
    assert png.exists() and png.with_suffix(".pdf").exists() and placeholder_reason(png) is None
    none = timelines.draw([timelines.Panel("a", None, "nsys absent")], tmp_path / "n.png", "t")
    assert "nsys absent" in placeholder_reason(none)
    text = timelines.summary(export)
    # the all-reduces: 50-70 and 91-130 us, busy 59 us; compute runs 52-90 us: 18 us overlap
    assert "2 NCCL kernels busy 0.059 ms, 30.5% of it while compute ran" in text
    assert "memory 100 → peak 150 MiB" in text  # after the first cudaMalloc


def test_labels_of_overlapping_boxes_do_not_meet(tmp_path, monkeypatch):
    """Collectives of two threads (or NCCL streams) overlap in one row: one label per place."""
    import matplotlib.pyplot as plt
    import pandas as pd

    nccl = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    rows = [(nccl, 0, 9e6, s) for s in (13, 14)] + [(nccl, 1e6, 8e6, 15)]
    rows += [("void gemm_kernel<1>(int)", 0, 10e6, 7)]
    kernels = pd.DataFrame(rows, columns=["name", "start_ns", "end_ns", "stream"])
    kernels["launch_ns"] = kernels["start_ns"]
    kernels["comm"] = kernels["name"].str.startswith("nccl")
    ranges = pd.DataFrame(columns=nsys_timeline.RANGE_COLUMNS)
    tl = nsys_timeline.Timeline(nsys_timeline.NSYS, ranges, kernels, None, "no memory track")
    monkeypatch.setattr(timelines, "save", lambda fig, path, tight=True: fig)
    fig = timelines.draw([timelines.Panel("overlap", tl)], tmp_path / "o.png", "t")
    boxes = [(t, b) for t, b in _label_boxes(fig) if t.startswith("ncclDev")]
    assert len(boxes) == 1  # three overlapping boxes, one label
    assert any(t == "gemm_kernel" for t, _ in _label_boxes(fig))
    plt.close(fig)
