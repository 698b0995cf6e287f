"""Part (f)'s timeline: the block's capture kept for the figure (torch.profiler without nsys,
the nsys export trimmed where nsys ran), the figure drawn around the block's forward and
backward, and the report's sentence about it."""

from __future__ import annotations

import pandas as pd
import torch
from nsys_tables import write_nsys_sqlite
from test_grids_2026 import _args

from cs336_systems.profiling import nsys_timeline
from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.memory import analysis, blocks, figures


def _grid(tmp_path, monkeypatch) -> tuple[pd.DataFrame, object]:
    monkeypatch.setattr(blocks.nsys_tools, "find_nsys", lambda setting=None: None)
    args = _args(tmp_path, context_lengths=[16], nsys_contexts=[16])
    rows = pd.DataFrame(blocks.block_grid(args, torch.device("cpu")))
    results = tmp_path / "results"
    results.mkdir()
    rows.to_csv(results / "memory_blocks.csv", index=False)
    return rows, results


def test_without_nsys_the_block_is_profiled_by_torch(tmp_path, monkeypatch):
    rows, results = _grid(tmp_path, monkeypatch)
    (cap,) = rows[rows["part"] == "nsys_capture"].itertuples()
    assert cap.status == "skipped: nsys absent"
    assert cap.timeline_source == nsys_timeline.TORCH
    tl = nsys_timeline.load(cap.timeline)
    # the saved window is the block's forward and backward, nothing before it
    names = list(tl.ranges["name"])
    assert names[0] == "block.forward" and "block.backward" in names
    fwd = tl.ranges[tl.ranges["name"] == "block.forward"].iloc[0]
    bwd = tl.ranges[tl.ranges["name"] == "block.backward"].iloc[0]
    assert tl.window == (fwd["start_ns"], bwd["end_ns"])
    assert len(tl.compute) > 5 and tl.memory is not None and tl.memory["bytes"].max() > 0

    png = figures._block_timeline_figure(results, tmp_path / "f" / "memory_block_timeline.png")
    assert placeholder_reason(png) is None and png.with_suffix(".pdf").exists()
    sentence = analysis.block_timeline(results)
    assert "tiny block, context 16, fp32" in sentence and "torch.profiler" in sentence
    assert "CPU memory" not in sentence and "compute operators" in sentence
    assert "collectives" not in sentence  # one block: nothing to say of communication


def test_nsys_capture_is_trimmed_and_preferred(tmp_path, monkeypatch):
    """Where nsys ran, its export (trimmed to the timeline's tables) is the figure's input."""
    args = _args(tmp_path, context_lengths=[16], nsys_contexts=[16])
    export = write_nsys_sqlite(tmp_path / "export.sqlite")
    monkeypatch.setattr(blocks.nsys_tools, "find_nsys", lambda setting=None: "/usr/bin/nsys")
    monkeypatch.setattr(blocks.nsys_tools, "export_sqlite", lambda nsys, rep, timeout: export)
    row = {"status": "ok", "capture": str(tmp_path / "cap.nsys-rep")}
    out = blocks.block_timeline(args, row, 16, "fp32", torch.device("cpu"))
    assert out["timeline_source"] == nsys_timeline.NSYS
    tl = nsys_timeline.read(out["timeline"])
    assert out["timeline"].endswith("tiny_block_16_fp32.sqlite")
    assert len(tl.communication) == 2 and tl.memory is not None

    results = tmp_path / "results"
    results.mkdir()
    base = {"part": "nsys_capture", "size": "tiny", "context_length": 16, "precision": "fp32"}
    torch_row = {
        **base,
        "status": "skipped: nsys absent",
        "timeline": str(export.with_name("x")),
        "timeline_source": nsys_timeline.TORCH,
    }
    pd.DataFrame([{**base, "status": "ok", **out}, torch_row]).to_csv(
        results / "memory_blocks.csv", index=False
    )
    r, why = figures.block_timeline_choice(results)
    assert why == "" and r["timeline_source"] == nsys_timeline.NSYS
    panel = figures.block_timeline_panel(results)
    assert panel.timeline.window == (850, 130_000)  # block.forward to the last kernel's end
    sentence = analysis.block_timeline(results)
    assert "from Nsight Systems" in sentence and "2 NCCL kernels" in sentence


def test_no_capture_is_a_note(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    png = figures._block_timeline_figure(results, tmp_path / "memory_block_timeline.png")
    assert "no part (f) rows" in placeholder_reason(png)
    pd.DataFrame(
        [
            {
                "part": "nsys_capture",
                "status": "error: nsys crashed",
                "context_length": 16,
                "precision": "fp32",
                "timeline_status": "error: profiler failed",
            }
        ]
    ).to_csv(results / "memory_blocks.csv", index=False)
    png = figures._block_timeline_figure(results, tmp_path / "memory_block_timeline.png")
    assert "error: profiler failed" in placeholder_reason(png)
    assert "No timeline of one block" in analysis.block_timeline(results)
