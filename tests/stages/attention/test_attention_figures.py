"""The attention section's figures when no point ran: every row out of memory or failed, each
figure is drawn (its axes and a note) or is a placeholder that says why, and the section's
context still composes."""

from __future__ import annotations

import pandas as pd
import pytest
from fixture_rows import prov, write_results
from PIL import Image

from cs336_systems.reporting.analysis import placeholder_reason
from cs336_systems.stages.attention import analysis as attention_analysis
from cs336_systems.stages.attention.measure import memory_accounting


def failed_rows(status: str) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {**prov(gpus=1), "device": "cuda", "impl": impl, "compile": impl[6:], "dtype": "fp32",
             "batch_size": 8, "heads": 1, "d_head": d, "seq_len": n, "causal": False,
             "warmup_steps": 1, "fwd_steps": 2, "bwd_steps": 2, "status": status,
             "oom_phase": "forward" if status == "oom" else "", "device_memory_mb": 81559.0,
             **memory_accounting(8, n, d)}
            for impl in ("naive_eager", "naive_compiled") for d in (16, 32) for n in (256, 1024)
        ]
    )  # fmt: skip


@pytest.mark.parametrize("status", ["oom", "error: RuntimeError: no kernel", "skipped: by test"])
def test_every_figure_draws_when_no_point_ran(tmp_path, status):
    results = write_results(tmp_path / "r", attention=failed_rows(status))
    paths = attention_analysis.plot(results, tmp_path / "f")
    names = ["attention_time.png", "attention_memory.png", "attention_compile.png"]
    assert [p.name for p in paths] == names
    for p in paths:
        with Image.open(p) as im:
            assert im.size[0] > 100
    assert "no point ran both" in placeholder_reason(paths[2])
    for p in paths[:2]:  # drawn: the counted memory needs no run; the time says none ran
        assert placeholder_reason(p) is None
    ctx = attention_analysis.context(results)
    assert ctx["compile"] == {"available": False}
    assert status.split(":")[0].upper() in ctx["timing_table"]


def test_no_label_collides_in_the_figures(tmp_path, monkeypatch):
    """The gpu preset's grid (d 16-128, n 256-16384), eager out of memory at the longest."""
    from figure_checks import capture, overlaps

    from cs336_systems.stages.attention import figures

    df = failed_rows("ok").drop(columns="status")
    rows = []
    for impl in ("naive_eager", "naive_compiled"):
        for d in (16, 32, 64, 128):
            for n in (256, 1024, 4096, 8192, 16384):
                t = 0.02 + d * n * n * 8 / 2e12
                oom = n == 16384 and d == 128
                rows.append({**df.iloc[0].to_dict(), "impl": impl, "compile": impl[6:],
                             "d_head": d, "seq_len": n, **memory_accounting(8, n, d),
                             "status": "oom" if oom else "ok",
                             "fwd_ms_mean": None if oom else t,
                             "bwd_ms_mean": None if oom else 2.5 * t,
                             "mem_before_backward_mb": None if oom else
                             memory_accounting(8, n, d)["expected_before_backward_mb"]})  # fmt: skip
    figs = capture(monkeypatch, figures)
    attention_analysis.plot(write_results(tmp_path / "r", attention=pd.DataFrame(rows)), tmp_path)
    assert len(figs) == 3
    for fig in figs:
        assert overlaps(fig) == []
