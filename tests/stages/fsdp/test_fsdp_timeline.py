"""fsdp_accounting (b)'s timeline: the profiled step's window kept by the stage (two gloo
ranks), its phases as ranges, and the figure of the forward with the all-gathers beside it."""

from __future__ import annotations

import pandas as pd
from pipeline_utils import block

from cs336_systems.core.results import write_csv
from cs336_systems.profiling import nsys_timeline
from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.fsdp import analysis, figures
from cs336_systems.stages.fsdp import measure as stage


def test_the_stage_keeps_each_profiled_step_and_the_figure_shows_its_forward(tmp_path):
    out = tmp_path / "fsdp" / "runs.csv"
    knobs = block(
        "fsdp", backend="gloo", world_size=2, size="tiny", context_length=8, batch_per_rank=1,
        variants=["fsdp"], warmup_steps=0, measure_steps=1, profile=True, timeout_s=240,
    )  # fmt: skip
    timelines = tmp_path / "fsdp" / "timelines"
    stage.main(["--machine", "m", "--preset", "cpu", *knobs, "--timeline-dir", str(timelines),
                "--out", str(out)])  # fmt: skip
    df = pd.read_csv(out)
    (r,) = df.itertuples()
    assert r.status == "ok" and r.timeline == "fsdp_fsdp_rank0.timeline.json.gz"
    tl = nsys_timeline.load(timelines / r.timeline)
    # the window is the profiled step; its phases are ranges inside it, in order
    names = list(tl.ranges.sort_values("start_ns")["name"])
    assert names[0] == "profiled_step"
    phases = [n for n in names if n in ("forward", "backward", "sync", "optimizer")]
    assert phases == ["forward", "backward", "sync", "optimizer"]
    assert tl.window[0] == tl.ranges["start_ns"].min()
    # a CPU run: gloo's all-gathers on their worker threads, the main thread's operators
    assert "gloo" in tl.comm_what and len(tl.communication) > 0 and len(tl.compute) > 0
    assert tl.communication["name"].str.contains("all_gather").any()

    write_csv(df, tmp_path / "fsdp.csv")
    fsdp, bf16 = figures.timeline_panels(tmp_path)
    assert fsdp.timeline is not None and bf16.timeline is None
    assert bf16.reason == "no such run in this results folder"
    fwd = tl.ranges[tl.ranges["name"] == "forward"].iloc[0]
    assert fsdp.timeline.window[0] == fwd["start_ns"] and fsdp.timeline.window[1] >= fwd["end_ns"]
    # the forward's window holds the forward's all-gathers, not the backward's
    gathers = fsdp.timeline.communication
    assert len(gathers) and (gathers["start_ns"] < fsdp.timeline.window[1]).all()
    png = figures._timeline(tmp_path, tmp_path / "fig" / "fsdp_timeline.png")
    assert placeholder_reason(png) is None and png.with_suffix(".pdf").exists()
    lines = analysis.context(tmp_path)["timeline_lines"]
    assert "torch.profiler" in lines[0] and "the forward range" in lines[0]
    assert "gloo collectives" in lines[0] and "no such run" in lines[1]


def test_without_a_profiled_step_the_figure_is_a_note(tmp_path):
    rows = pd.DataFrame([{"variant": "fsdp", "status": "ok"},
                         {"variant": "fsdp_bf16", "status": "oom"}])  # fmt: skip
    rows.to_csv(tmp_path / "fsdp.csv", index=False)
    png = figures._timeline(tmp_path, tmp_path / "fsdp_timeline.png")
    why = placeholder_reason(png)
    assert "no profiled step kept" in why and "oom" in why
