"""ddp_overlap (b)'s timeline: naive and overlapped DDP's profiled steps kept by the stage (two
gloo ranks) and drawn on one time scale."""

from __future__ import annotations

import pandas as pd
from nsys_tables import write_gpu_trace
from pipeline_utils import block

from cs336_systems.core.results import write_csv
from cs336_systems.profiling import nsys_timeline
from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.ddp import analysis, figures
from cs336_systems.stages.ddp import measure as bench


def test_naive_and_overlapped_steps_are_kept_and_drawn(tmp_path):
    knobs = block(
        "ddp", context_length=16, batch_per_rank=2, warmup_steps=0, measure_steps=1,
        variants=["naive", "overlap"], bucket_sizes_mb=[1], profile=True, timeout_s=240,
    )  # fmt: skip
    timelines = tmp_path / "ddp" / "timelines"
    args = bench.parse_args(
        ["variants", "--machine", "m", "--preset", "cpu", *knobs, "--timeline-dir",
         str(timelines), "--out", str(tmp_path / "out.csv")]
    )  # fmt: skip
    rows = pd.DataFrame(bench.run(args))
    kept = dict(zip(rows["variant"], rows.get("timeline", pd.Series(dtype=str)), strict=True))
    assert kept["naive"] == "ddp_naive_rank0.timeline.json.gz"
    assert kept["overlap"] == "ddp_overlap_rank0.timeline.json.gz"
    for name in ("naive", "overlap"):
        tl = nsys_timeline.load(timelines / kept[name])
        assert tl.ranges["name"].iloc[0] == "profiled_step"
        # gloo's all-reduces on their threads, the main thread's operators
        assert tl.communication["name"].str.contains("all_reduce").any(), name
        assert len(tl.compute) > 0

    write_csv(rows, tmp_path / "ddp.csv")
    naive, overlap = figures.timeline_panels(tmp_path)
    assert naive.timeline is not None and overlap.timeline is not None
    png = figures._timeline(tmp_path, tmp_path / "fig" / "ddp_timeline.png")
    assert placeholder_reason(png) is None and png.with_suffix(".pdf").exists()


def test_gpu_windows_are_described_with_their_nccl_kernels(tmp_path):
    """Two synthetic GPU steps: both panels drawn, each line with its NCCL kernels."""
    folder = tmp_path / "ddp" / "timelines"
    folder.mkdir(parents=True)
    trace = write_gpu_trace(tmp_path / "trace.json")
    for v in ("naive", "overlap"):
        nsys_timeline.save_window(trace, r"block\..*", folder / f"ddp_{v}_rank0.timeline.json.gz")
    pd.DataFrame(
        [{"kind": "variants", "variant": v, "bucket_size_mb": None, "status": "ok",
          "timeline": f"ddp_{v}_rank0.timeline.json.gz"} for v in ("naive", "overlap")]
    ).to_csv(tmp_path / "ddp.csv", index=False)  # fmt: skip
    lines = analysis.describe(figures.timeline_panels(tmp_path))
    assert len(lines) == 2 and all("2 NCCL kernels" in x for x in lines)
    assert lines[0].startswith("naive DDP") and lines[1].startswith("overlapped DDP")


def test_no_profiled_step_is_a_note(tmp_path):
    pd.DataFrame([{"kind": "variants", "variant": "naive", "status": "ok"}]).to_csv(
        tmp_path / "ddp.csv", index=False
    )
    png = figures._timeline(tmp_path, tmp_path / "ddp_timeline.png")
    why = placeholder_reason(png)
    assert "no profiled step kept" in why and "no such run" in why
